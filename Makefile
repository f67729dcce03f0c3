# The interface to working on keel: `make install`, `make run`, `make test`, `make lint`,
# `make docs`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := shared services deploy bench devkit tests
# mypy runs twice: tests/ import deploy's modules as deploy.<name>, while deploy's own
# scripts import each other by their bare names.
TYPED := shared services deploy bench devkit
# devkit/ (the harness of the tests, the benchmarks and `make run`) is not shipped: a .pth
# file puts this checkout on the virtualenv's path instead.
CHECKOUT_PTH := $(VENV)/.checkout-on-path

.DEFAULT_GOAL := all

.PHONY: install
install: $(STAMP) $(CHECKOUT_PTH) ## create .venv and install keel with its dev tools (again when pyproject.toml changes)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

$(CHECKOUT_PTH): | $(BIN)/python
	$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "keel-checkout.pth").write_text("$(CURDIR)\n")'
	touch $@

# Lint and test need a virtualenv, but do not reinstall an existing one: `make install` does.
# (The virtualenv's own rule, not `install`, whose .pth file needs this one: under
# `make -n` nothing is made and `install` would call itself for ever.)
$(BIN)/python:
	$(MAKE) $(STAMP)

.PHONY: fmt
fmt: $(BIN)/python ## format the code and apply safe lint fixes
	$(BIN)/ruff format $(SOURCES)
	$(BIN)/ruff check --fix $(SOURCES)

.PHONY: lint
lint: $(BIN)/python ## ruff (lint and format check) and mypy
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy $(TYPED)
	$(BIN)/mypy tests

# The operator's guide (docs/, Markdown through MyST) as HTML in .keel/docs/. Any warning
# fails the build, a link to a missing page or heading included; nothing is fetched.
.PHONY: docs
docs: $(BIN)/python ## build the operator's guide (docs/) into .keel/docs/; any warning fails it
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs .keel/docs

.PHONY: typecheck
typecheck: $(BIN)/python ## mypy --strict (what make lint checks with it)
	$(BIN)/mypy $(TYPED)
	$(BIN)/mypy tests

# The test tiers, in the order `make test` and .ci/run run them; the first red one stops
# the run. `make test-<tier>` runs one: pytest over tests/<tier>/. A new tier of pytest
# tests that need the servers is one word in SERVER_TIERS (a tier run otherwise gets its
# own `test-<tier>` rule and a word in TIERS).
SERVER_TIERS := functional e2e ha bench
TIERS := unit $(SERVER_TIERS) partitions tempest keystone clients libvirt
# Extra pytest options for every tier, e.g. PYTEST_ARGS=-x.
PYTEST_ARGS ?=

.NOTPARALLEL:

# `make test` runs the tiers in lanes (devkit/lanes.py): the tiers of a lane one after
# another, the lanes at once, the first red tier stopping them all. Each lane is a word of
# tiers joined by commas, and every tier is in one. Two lanes where there are two cores or
# more (the second lane's tiers mostly wait); TIER_LANES="$(subst $(space),$(comma),$(TIERS))"
# runs them all in one lane, in order.
comma := ,
space := $(subst ,, )
TIER_LANES ?= $(if $(filter-out 0 1,$(shell nproc)),$(LANES_TWO),$(subst $(space),$(comma),$(TIERS)))
# The first lane (functional and e2e, CPU-bound) is the run's length: the HA tier ends the
# second lane, beside e2e's end and the benchmarks, which run after e2e in the first.
LANES_TWO := unit,functional,e2e,bench keystone,clients,tempest,partitions,libvirt,ha

.PHONY: test
test: prerequisites ## every tier (make tiers), in TIER_LANES run at once, stopping at the first red one
	$(BIN)/python -m devkit.lanes --tiers "$(TIERS)" $(TIER_LANES)

.PHONY: tiers
tiers: ## the test tiers, in the order make test runs them
	@echo $(TIERS)

.PHONY: prerequisites
prerequisites: $(CHECKOUT_PTH) ## check that PostgreSQL, RabbitMQ and its management API answer
	@$(BIN)/python -m devkit.prerequisites

.PHONY: test-unit
test-unit: $(CHECKOUT_PTH) ## unit tests (no PostgreSQL or RabbitMQ needed)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# test-functional: services against real PostgreSQL and RabbitMQ; test-e2e: the real
# processes driven by the real openstack CLI; test-ha: keel on a RabbitMQ cluster and a
# PostgreSQL primary with a standby that the tests start and break; test-bench: every
# benchmark, tiny.
.PHONY: $(addprefix test-,$(SERVER_TIERS))
$(addprefix test-,$(SERVER_TIERS)): test-%: prerequisites
	$(BIN)/pytest $(or $(TIER_DIRS_$*),tests/$*) $(TIER_ARGS_$*) $(PYTEST_ARGS)

# The functional tier also runs the model-based test (tests/model/: CI's fixed examples).
TIER_DIRS_functional := tests/functional tests/model
# TIER_WORKERS=N runs the functional and e2e tiers' modules in N processes at once
# (pytest-xdist), a module and its fixtures (an e2e module's cloud) in one process. Their
# tests mostly wait (for PostgreSQL, for a cloud's processes), so two processes finish
# well before one even on two cores (the functional tier in 9 minutes instead of 20 on
# a busy machine): 2 by default where there are two cores or more; 0 runs the modules
# one after another.
TIER_WORKERS ?= $(shell [ "$$(nproc)" -ge 2 ] && echo 2 || echo 0)
TIER_ARGS_functional = $(if $(filter-out 0,$(TIER_WORKERS)),-n $(TIER_WORKERS) --dist loadfile)
TIER_ARGS_e2e = $(TIER_ARGS_functional)

# The model-based test at length: MODEL_EXAMPLES examples shared by MODEL_WORKERS
# processes, each from a new seed (or one process with SEED=N, to run a search again),
# then how many ran per second; then every crash point of the move workflows (which the
# functional tier runs too).
MODEL_EXAMPLES ?= 5000
MODEL_WORKERS ?= $(shell nproc)
SEED ?=
.PHONY: test-model
test-model: prerequisites ## the model-based search: MODEL_EXAMPLES (5000) over MODEL_WORKERS processes (SEED=N: again); prints examples/s
	$(BIN)/python -m devkit.model_search --examples $(MODEL_EXAMPLES) \
		--workers $(MODEL_WORKERS) $(if $(SEED),--seed $(SEED)) $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))
	$(if $(SEED),,KEEL_MODEL_EXAMPLES=$(MODEL_EXAMPLES) $(BIN)/pytest tests/model/test_crash_points.py -q $(PYTEST_ARGS))

# The schemathesis fuzzing run of tests/e2e/test_hostile_clients.py at depth: FUZZ_EXAMPLES
# cases per API operation (the e2e tier runs 12), at the latest microversion and at 2.1.
# Opt-in (not in make test or CI): about 2.5 s per example on two cores.
FUZZ_EXAMPLES ?= 100
.PHONY: test-fuzz
test-fuzz: prerequisites ## opt-in: the OpenAPI fuzzing run with FUZZ_EXAMPLES (100) cases per operation
	KEEL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest tests/e2e/test_hostile_clients.py \
		-k fuzzing $(PYTEST_ARGS)

# test-partitions: compute agents on hosts of their own (network and UTS namespaces), cut
# off, healed and degraded for real, and a randomized run (KEEL_PARTITIONS_SECONDS: 600,
# 120 under CI). Needs root and iproute2; skipped, saying why, without them (under CI it
# fails instead).
.PHONY: test-partitions
test-partitions: prerequisites
	KEEL_TEST_PARTITIONS=1 $(BIN)/pytest tests/partitions $(PYTEST_ARGS)

.PHONY: run
run: install ## run a local cloud in the foreground; Ctrl-C stops it
	$(BIN)/python deploy/localcloud.py

.PHONY: image
image: $(BIN)/python ## build the tiny test guest (kernel, initramfs, disk) into .keel/images/
	$(BIN)/python deploy/guestimage.py --output .keel/images

# The opt-in Debian guest with the real cloud-init (a few minutes; needs root): what
# test-debian boots. mmdebstrap comes from Debian's apt when missing.
.PHONY: image-debian
image-debian: $(BIN)/python ## build the Debian guest with cloud-init into .keel/images/ (opt-in, slow)
	command -v mmdebstrap >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap)
	$(BIN)/python deploy/debianimage.py --output .keel/images

.PHONY: install-libvirt
install-libvirt: install ## add the libvirt binding (needs libvirt-dev and pkg-config)
	$(BIN)/pip install --quiet -e '.[dev,libvirt]'

# test-libvirt: real virtual machines under libvirtd (deploy/libvirt-host.sh sets a
# machine up, make install-libvirt adds the binding); skipped, saying why, without them.
.PHONY: test-libvirt
test-libvirt: prerequisites
	KEEL_TEST_LIBVIRT=1 $(BIN)/pytest tests/libvirt $(PYTEST_ARGS)

# test-debian (opt-in, not in make test): the Debian guest (make image-debian) reads keel's
# config drive and metadata service with the real cloud-init, under libvirtd.
.PHONY: test-debian
test-debian: prerequisites image-debian ## opt-in: the Debian cloud-init guest boots from a config drive and the metadata service
	KEEL_TEST_LIBVIRT=1 KEEL_TEST_DEBIAN=1 $(BIN)/pytest tests/debian $(PYTEST_ARGS)

.PHONY: clean
clean: $(CHECKOUT_PTH) ## drop the local cloud's database and .keel/ (refused while it runs)
	$(BIN)/python deploy/localcloud.py clean

# Tempest, OpenStack's own API tests, in a virtualenv of its own (its dependencies are
# not keel's). `make tempest TEMPEST_REGEX=servers` runs a slice.
TEMPEST_VENV ?= .tempest-venv
TEMPEST_STAMP := $(TEMPEST_VENV)/.installed
TEMPEST_REGEX ?=
TEMPEST_CONCURRENCY ?= 2

$(TEMPEST_STAMP): tests/tempest/requirements.txt
	test -x $(TEMPEST_VENV)/bin/python || $(PYTHON) -m venv $(TEMPEST_VENV)
	$(TEMPEST_VENV)/bin/pip install --quiet -r tests/tempest/requirements.txt
	touch $@

.PHONY: tempest test-tempest
tempest: $(BIN)/python $(CHECKOUT_PTH) $(TEMPEST_STAMP) ## Tempest's compute API tests against a cloud of their own
	$(BIN)/python -m tests.tempest.run --venv $(TEMPEST_VENV) \
		--concurrency $(TEMPEST_CONCURRENCY) $(if $(TEMPEST_REGEX),--regex '$(TEMPEST_REGEX)')

# The tier: every included test, whatever TEMPEST_REGEX says.
test-tempest: prerequisites $(TEMPEST_STAMP)
	$(BIN)/python -m tests.tempest.run --venv $(TEMPEST_VENV) --concurrency $(TEMPEST_CONCURRENCY)

# Stock tools nobody here wrote, driving a cloud of their own: Ansible's openstack.cloud
# collection (bundled by the `ansible` package on PyPI), in a virtualenv of its own
# (the tier `clients`).
CLIENTS_VENV ?= .clients-venv
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed

$(CLIENTS_STAMP): tests/clients/requirements.txt
	test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install --quiet -r tests/clients/requirements.txt
	touch $@

.PHONY: test-clients
test-clients: prerequisites $(CLIENTS_STAMP) ## Ansible playbooks against a cloud of their own (installed in .clients-venv)
	KEEL_CLIENTS_VENV=$(CLIENTS_VENV) $(BIN)/pytest tests/clients $(PYTEST_ARGS)

# Keystone (from PyPI) in a virtualenv of its own, like Tempest: the keystone tier runs it
# on a scratch PostgreSQL database under gunicorn and puts keel-api behind it.
KEYSTONE_VENV ?= .keystone-venv
KEYSTONE_STAMP := $(KEYSTONE_VENV)/.installed

$(KEYSTONE_STAMP): tests/keystone/requirements.txt
	test -x $(KEYSTONE_VENV)/bin/python || $(PYTHON) -m venv $(KEYSTONE_VENV)
	$(KEYSTONE_VENV)/bin/pip install --quiet -r tests/keystone/requirements.txt
	touch $@

.PHONY: test-keystone
test-keystone: prerequisites $(KEYSTONE_STAMP) ## keel-api behind a real Keystone (installed in .keystone-venv)
	KEEL_KEYSTONE_VENV=$(abspath $(KEYSTONE_VENV)) $(BIN)/pytest tests/keystone $(PYTEST_ARGS)

# Rally (rally-openstack, from PyPI) in a virtualenv of its own, like Tempest: its
# NovaServers.boot_and_delete_server with the users context against a cloud of its own
# (bench/rally.py). `make rally` runs the issue's size; `make test-rally` a small one (not
# in CI: with its virtualenv's install it takes about four minutes).
RALLY_VENV ?= .rally-venv
RALLY_STAMP := $(RALLY_VENV)/.installed
RALLY_TIMES ?= 200
RALLY_CONCURRENCY ?= 20

$(RALLY_STAMP): bench/rally-requirements.txt
	test -x $(RALLY_VENV)/bin/python || $(PYTHON) -m venv $(RALLY_VENV)
	$(RALLY_VENV)/bin/pip install --quiet -r bench/rally-requirements.txt
	touch $@

.PHONY: rally test-rally
rally: $(CHECKOUT_PTH) $(RALLY_STAMP) ## Rally's boot_and_delete_server: RALLY_TIMES (200) at RALLY_CONCURRENCY (20)
	$(BIN)/python bench/rally.py --venv $(RALLY_VENV) --times $(RALLY_TIMES) \
		--concurrency $(RALLY_CONCURRENCY)

# 10 iterations at concurrency 2, whatever RALLY_TIMES says.
test-rally: prerequisites $(RALLY_STAMP) ## Rally's boot_and_delete_server, 10 iterations at concurrency 2 (not in CI)
	$(BIN)/python bench/rally.py --venv $(RALLY_VENV) --times 10 --concurrency 2

# The same task against keel and against a Nova control plane from PyPI (nova, placement,
# keystone, glance: bench/nova-requirements.txt, in a virtualenv of its own) stood up on
# this machine with the fake driver, alternating (bench/rally_nova.py; not in CI). Nova's
# databases are on the machine's MariaDB (127.0.0.1:3306, root), its messages in a
# RabbitMQ virtual host of its own.
NOVA_VENV ?= .nova-venv
NOVA_STAMP := $(NOVA_VENV)/.installed
RALLY_ROUNDS ?= 1

$(NOVA_STAMP): bench/nova-requirements.txt
	test -x $(NOVA_VENV)/bin/python || $(PYTHON) -m venv $(NOVA_VENV)
	$(NOVA_VENV)/bin/pip install --quiet -r bench/nova-requirements.txt
	touch $@

.PHONY: rally-nova
rally-nova: prerequisites $(RALLY_STAMP) $(NOVA_STAMP) ## Rally against keel and Nova (from PyPI), alternating: RALLY_TIMES at RALLY_CONCURRENCY, RALLY_ROUNDS (1)
	$(BIN)/python bench/rally_nova.py --nova --venv $(RALLY_VENV) --nova-venv $(NOVA_VENV) \
		--times $(RALLY_TIMES) --concurrency $(RALLY_CONCURRENCY) --rounds $(RALLY_ROUNDS)

# Each benchmark prints a human line and a JSON line per figure, and PASS/FAIL against
# its targets (never enforced). `make bench` is the quick set (a few minutes);
# `make bench-full` runs the issue's sizes. bench/RESULTS.md records a run.
BENCH_QUICK := \
	"schedule.py --hosts 100 1000 10000 --requests 200 --concurrency 1 8 32" \
	"rpc.py --calls 2000 --concurrency 1 100 --casts 3000" \
	"storm.py --hosts 300" \
	"memory.py --fleet-hosts 300" \
	"login.py --users 20 --logins 200 --requests 200" \
	"boot.py --servers 500 --clients 50 --hosts 100" \
	"evacuate.py" \
	"backfill.py" \
	"scratch_db.py" \
	"soak.py --seconds 60 --clients 10 --hosts 10" \
	"faults.py --faults broker-kill,db-failover --clients 4 --before 15 --after 30"
BENCH_FULL := \
	"schedule.py --hosts 100 1000 10000 --requests 1000 --concurrency 1 8 32" \
	"rpc.py --calls 5000 --concurrency 1 100 --casts 10000" \
	"storm.py --hosts 1000" \
	"memory.py --fleet-hosts 1000" \
	"login.py --users 50 --logins 500 --requests 500" \
	"boot.py --servers 2000 --clients 50 --hosts 100" \
	"evacuate.py" \
	"backfill.py" \
	"scratch_db.py" \
	"soak.py --seconds 600 --clients 20 --hosts 20 --sample 30" \
	"faults.py --clients 10 --before 30 --after 60"

.PHONY: bench
bench: $(CHECKOUT_PTH) ## the benchmarks in bench/, quick sizes (a few minutes)
	@for run in $(BENCH_QUICK); do echo "== bench/$$run"; $(BIN)/python bench/$$run || exit 1; done

.PHONY: bench-full
bench-full: $(CHECKOUT_PTH) ## the benchmarks at the issue's sizes (longer)
	@for run in $(BENCH_FULL); do echo "== bench/$$run"; $(BIN)/python bench/$$run || exit 1; done

.PHONY: all
all: lint test ## lint, then test

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | sort
	@printf 'test-<tier>\tone tier: %s\n' "$(TIERS)"
