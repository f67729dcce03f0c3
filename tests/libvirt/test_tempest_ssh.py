"""Tempest's compute tests that SSH into the servers they boot, on the libvirt driver.

Tempest (from ``.tempest-venv``, which ``make tempest`` and the tempest tier build) runs
with ``run_validation = True``: it makes a key pair for each test class, boots the test
guest with it and SSHes in as root at the server's address on the network
``forwarded`` (each guest's SSH forward; Tempest always connects to port 22, so the
agents forward from port 22 here), then checks what the guest says: its host name is the
server's name, it has the flavor's vCPUs, a reboot boots it again. The tests, each
listed in :data:`TESTS`, must all pass.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from pathlib import Path

import pytest

from tests.libvirt.cloud import FLAVOR, HOSTS, libvirt_cloud
from tests.libvirt.conftest import unavailable
from tests.libvirt.images import REPO
from tests.tempest import config
from tests.tempest.run import Totals, provision, run_tempest

TEMPEST = REPO / ".tempest-venv" / "bin" / "tempest"
#: The SSH-validating tests this tier runs (regular expressions, one test or class each).
TESTS = (
    # Boots one server with a key pair and waits until SSH answers; then, over SSH:
    # test_verify_created_server_vcpus and test_host_name_is_same_as_server_name (and
    # the class's API checks of the same server).
    r"tempest\.api\.compute\.servers\.test_create_server\.ServersTestJSON\.",
    # A hard reboot of a server SSHable before and after: the boot time it reads over SSH
    # moves on.
    r"tempest\.api\.compute\.servers\.test_server_actions\.ServerActionsTestJSON\."
    r"test_reboot_server_hard\b",
)
#: The tests :data:`TESTS` selects (Tempest 47.0.0), all of which must pass: 5 of
#: ServersTestJSON (test_host_name_is_same_as_server_name,
#: test_verify_created_server_vcpus, test_list_servers, test_list_servers_with_detail,
#: test_verify_server_details) and test_reboot_server_hard.
EXPECTED = 6


@pytest.fixture(scope="module")
def tempest() -> Path:
    if not TEMPEST.exists():
        unavailable(f"{TEMPEST} is missing: `make .tempest-venv/.installed` builds it")
    return TEMPEST


@pytest.mark.timeout(900)
async def test_tempests_ssh_validating_compute_tests_pass(
    tempest: Path, guest_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A short path: the guests' metadata sockets live under it (at most 107 bytes).
    workdir = tmp_path_factory.mktemp("tempest-lv")
    (workdir / "run").mkdir(parents=True)
    (workdir / "cloud").mkdir()
    ports = dict.fromkeys(HOSTS, 22)
    admin = config.Admin("tempest-admin", "tempest-admin", secrets.token_urlsafe(18))
    async with libvirt_cloud(workdir / "cloud", guest_images, ports) as cloud:
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
        )
        conf = workdir / "tempest.conf"
        conf.write_text(config.tempest_conf(described, workdir, admin), encoding="utf-8")
        args = argparse.Namespace(regex="|".join(TESTS), concurrency=2)
        output = await asyncio.to_thread(run_tempest, tempest, conf, args, workdir / "run")

    totals = Totals.parse(output)
    assert totals.failed == 0, output[-5000:]
    assert totals.passed == EXPECTED, output[-5000:]
