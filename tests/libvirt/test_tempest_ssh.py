"""Tempest's compute tests that SSH into the servers they boot, on the libvirt driver.

Tempest (from ``.tempest-venv``, which ``make tempest`` and the tempest tier build) runs
with ``run_validation = True``: it makes a key pair for each test class, boots the test
guest with it and SSHes in as root at the server's address on the network
``forwarded`` (each guest's SSH forward; Tempest always connects to port 22, so the
agents forward from port 22 here), then checks what the guest says: its host name is the
server's name, it has the flavor's vCPUs, a reboot boots it again. lv-b's agent uses
the tier's second libvirtd (:mod:`tests.libvirt.second_daemon`), so Tempest's live
migration tests move real guests between two daemons. The tests, each listed in
:data:`TESTS`, must all pass.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.libvirt import second_daemon
from tests.libvirt.cloud import FLAVOR, HOSTS, libvirt_cloud
from tests.libvirt.conftest import unavailable
from tests.libvirt.guests import free_port
from tests.libvirt.images import REPO
from tests.tempest import config
from tests.tempest.run import Totals, provision, run_tempest

TEMPEST = REPO / ".tempest-venv" / "bin" / "tempest"
#: The SSH-validating tests this tier runs (regular expressions, one test or class each).
SSH_TESTS = (
    # Boots one server with a key pair and waits until SSH answers; then, over SSH:
    # test_verify_created_server_vcpus and test_host_name_is_same_as_server_name (and
    # the class's API checks of the same server).
    r"tempest\.api\.compute\.servers\.test_create_server\.ServersTestJSON\.",
    # A hard reboot of a server SSHable before and after: the boot time it reads over SSH
    # moves on.
    r"tempest\.api\.compute\.servers\.test_server_actions\.ServerActionsTestJSON\."
    r"test_reboot_server_hard\b",
)
#: Live migration between the two hosts, lv-b's agent on the tier's second libvirtd: a
#: running and a paused server move to the other host, libvirt copying memory and disk
#: (Tempest checks the host and the status the server ends with).
LIVE_TESTS = (
    r"tempest\.api\.compute\.admin\.test_live_migration\.LiveMigrationTest\."
    r"test_live_block_migration(_paused)?\b",
)
#: How many tests each run selects (Tempest 47.0.0), all of which must pass. SSH: 5 of
#: ServersTestJSON (test_host_name_is_same_as_server_name,
#: test_verify_created_server_vcpus, test_list_servers, test_list_servers_with_detail,
#: test_verify_server_details) and test_reboot_server_hard; live: test_live_block_migration
#: and test_live_block_migration_paused.
EXPECTED = {"ssh": 6, "live": 2}


@pytest.fixture(scope="module")
def tempest() -> Path:
    if not TEMPEST.exists():
        unavailable(f"{TEMPEST} is missing: `make .tempest-venv/.installed` builds it")
    return TEMPEST


@pytest.fixture(scope="module")
def daemon(libvirt_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with second_daemon.running(tmp_path_factory.mktemp("second-libvirtd")) as running:
        yield running


@pytest.mark.timeout(900)
@pytest.mark.parametrize("run", ["ssh", "live"])
async def test_tempests_ssh_validating_and_live_migration_tests_pass(
    run: str,
    tempest: Path,
    guest_images: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    # A short path: the guests' metadata sockets live under it (at most 107 bytes).
    workdir = tmp_path_factory.mktemp(f"tempest-lv-{run}")
    (workdir / "run").mkdir(parents=True)
    (workdir / "cloud").mkdir()
    tests: tuple[str, ...]
    settings: dict[str, dict[str, str]]
    if run == "ssh":
        # Tempest SSHes to port 22 of each server's forward.
        ports, settings, tests = dict.fromkeys(HOSTS, 22), {}, SSH_TESTS
    else:
        # A guest's forward address is its own on every host: while it moves, both
        # hosts' QEMU hold it, so each host forwards from a port of its own.
        daemon = request.getfixturevalue("daemon")
        ports = {host: free_port() for host in HOSTS}
        settings, tests = {"lv-b": {"KEEL_LIBVIRT__URI": daemon.uri}}, LIVE_TESTS
    admin = config.Admin("tempest-admin", "tempest-admin", secrets.token_urlsafe(18))
    async with libvirt_cloud(
        workdir / "cloud", guest_images, ports, host_settings=settings
    ) as cloud:
        await provision(cloud, admin)
        image = cloud.openstack("image", "show", "keel-test")["id"]
        flavor = cloud.openstack("flavor", "show", FLAVOR)["id"]
        described = config.Cloud(
            api_url=cloud.api_url,
            image_ref=image,
            image_ref_alt=image,
            flavor_ref=flavor,
            flavor_ref_alt=flavor,
            compute_nodes=len(HOSTS),
            network_for_ssh="forwarded",
            features=(("metadata_service", True), ("config_drive", True)),
            # TCG guests, and in CI every other tier beside them: what takes a few
            # seconds here may take minutes there.
            build_timeout=300,
        )
        conf = workdir / "tempest.conf"
        conf.write_text(config.tempest_conf(described, workdir, admin), encoding="utf-8")
        args = argparse.Namespace(regex="|".join(tests), concurrency=2)
        output = await asyncio.to_thread(run_tempest, tempest, conf, args, workdir / "run")

    totals = Totals.parse(output)
    why = _failures(output) + keel_log_excerpt(workdir / "cloud" / "logs")
    assert totals.failed == 0, why
    assert totals.passed == EXPECTED[run], why


def _failures(output: str) -> str:
    """Tempest's traceback of each failed test (what it waited for, and how long)."""
    start = output.find("Captured traceback:")
    return output[start : start + 4000] if start >= 0 else output[-3000:]


def keel_log_excerpt(logs: Path, limit: int = 60) -> str:
    """What keel's processes said that explains a failure: their warnings and errors, and
    each move's decisions (the last ``limit`` such lines, in each log's order)."""
    wanted = ("WARNING", "ERROR", "migrat")
    lines = [
        f"{log.stem}: {line[:400]}"
        for log in sorted(logs.glob("*.log"))
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
        if any(word in line for word in wanted) and "node froze" not in line  # a start-up hint
    ]
    return "\n\nkeel's logs (warnings, errors, moves):\n" + "\n".join(lines[-limit:])
