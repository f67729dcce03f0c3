#!/usr/bin/env bash
# The servers `make run` and `make test` need, on this machine (Debian or Ubuntu, as root).
#
# The README's quick start names this script; CI runs it and nothing else to set the
# machine up, so a step missing here fails CI too. Each step is skipped when already done:
#
#   1. install postgresql, rabbitmq-server and python3-venv from the system packages
#      when missing, and the browser the e2e tier drives the operator's page with
#      (chromium and chromium-driver: /usr/bin/chromium, /usr/bin/chromedriver);
#   2. start PostgreSQL (pg_ctlcluster --skip-systemctl-redirect <version> main start)
#      and let the user postgres connect over 127.0.0.1 without a password (trust);
#   3. start RabbitMQ (rabbitmq-server -detached), whose user guest/guest may connect
#      from this machine;
#   4. enable RabbitMQ's management plugin (rabbitmq-plugins enable rabbitmq_management):
#      `keel-manage agent credentials` and the tests make broker users through it;
#   5. for the HA tier's PostgreSQL pair, which fails over by itself: etcd (Debian's
#      etcd-server; only the binary is used, the tests start their own) and Patroni with
#      what it needs, pinned in deploy/ha/patroni-requirements.txt, in a virtualenv of
#      Debian's python3 at /opt/keel/patroni (readable by the postgres user, which runs
#      it; a virtualenv of a Python under /root would not be).
#
# Any failure stops the script non-zero.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
WAIT_SECONDS=${WAIT_SECONDS:-120}

log() { printf '\n=== %s\n' "$*"; }

port_open() {
    python3 - "$1" <<'PY'
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2).close()
except OSError:
    sys.exit(1)
PY
}

wait_for_port() {
    local name=$1 port=$2 waited=0
    until port_open "$port"; do
        if (( waited >= WAIT_SECONDS )); then
            echo "$name did not accept connections on port $port within ${WAIT_SECONDS}s" >&2
            return 1
        fi
        sleep 2
        waited=$((waited + 2))
    done
    echo "$name accepts connections on port $port"
}

install_packages() {
    local missing=()
    command -v pg_ctlcluster >/dev/null || missing+=(postgresql)
    command -v rabbitmq-server >/dev/null || missing+=(rabbitmq-server)
    python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
    command -v chromium >/dev/null || missing+=(chromium)
    command -v chromedriver >/dev/null || missing+=(chromium-driver)
    command -v etcd >/dev/null || missing+=(etcd-server)
    /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
    if (( ${#missing[@]} )); then
        log "installing ${missing[*]}"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

start_postgres() {
    log "PostgreSQL"
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    if ! port_open 5432; then
        pg_ctlcluster --skip-systemctl-redirect "$version" main start
    fi
    wait_for_port PostgreSQL 5432
    if ! psql -h 127.0.0.1 -U postgres -w -d postgres -Atc 'SELECT 1' >/dev/null 2>&1; then
        echo "allowing password-less connections as postgres from 127.0.0.1 (trust)"
        local hba=/etc/postgresql/$version/main/pg_hba.conf
        sed -i '1i host all postgres 127.0.0.1/32 trust\nhost all postgres ::1/128 trust' "$hba"
        pg_ctlcluster --skip-systemctl-redirect "$version" main reload
        sleep 1
        psql -h 127.0.0.1 -U postgres -w -d postgres -Atc 'SELECT 1' >/dev/null
    fi
    echo "PostgreSQL lets postgres in over 127.0.0.1"
}

start_rabbitmq() {
    log "RabbitMQ"
    if ! port_open 5672; then
        rabbitmq-server -detached
    fi
    wait_for_port RabbitMQ 5672
    timeout "$WAIT_SECONDS" rabbitmqctl await_startup >/dev/null
    rabbitmq-plugins enable --quiet rabbitmq_management >/dev/null
    wait_for_port "RabbitMQ management API" 15672
}

PATRONI_VENV=/opt/keel/patroni
PATRONI_PINS="$(cd "$(dirname "$0")" && pwd)/ha/patroni-requirements.txt"

install_patroni() {
    log "Patroni"
    local stamp=$PATRONI_VENV/.installed
    if [[ -f $stamp ]] && cmp -s "$PATRONI_PINS" "$stamp"; then
        echo "Patroni is installed in $PATRONI_VENV"
        return
    fi
    rm -rf "$PATRONI_VENV"
    mkdir -p "$(dirname "$PATRONI_VENV")"
    /usr/bin/python3 -m venv "$PATRONI_VENV"
    "$PATRONI_VENV/bin/pip" install --quiet --no-cache-dir -r "$PATRONI_PINS"
    chmod -R a+rX "$PATRONI_VENV"
    cp "$PATRONI_PINS" "$stamp"
    "$PATRONI_VENV/bin/patroni" --version
}

install_packages
install_patroni
start_postgres
start_rabbitmq
