"""Server snapshots on the libvirt driver, with the stock client: the guest's disk is
converted with its backing chain, the running guest paused meanwhile and running again
after, and the image, saved back, holds the data only that guest's disk had."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.cloud import Cloud
from tests.e2e.moves import until_server
from tests.libvirt.cloud import HOSTS, libvirt_cloud
from tests.libvirt.test_cloud import FORWARD_PORTS, create, domain_state, qemu_io


@pytest.fixture(scope="module")
async def cloud(
    guest_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cloud]:
    workdir = tmp_path_factory.mktemp("libvirt-snapshots")
    async with libvirt_cloud(workdir, guest_images, FORWARD_PORTS) as running:
        yield running


@pytest.mark.timeout(300)  # the module's cloud starts within it, and a guest boots
async def test_a_snapshot_holds_the_guests_data_and_the_guest_runs_on(
    cloud: Cloud, libvirt_uri: str, tmp_path: Path
) -> None:
    host = HOSTS[0]
    sid = create(cloud, "snapped", host)["id"]
    cloud.openstack("server", "stop", sid, as_json=False)
    await until_server(cloud, sid, "SHUTOFF")
    disk = cloud.state_dir(host) / "instances" / sid / "disk"
    qemu_io(disk, "write -P 0xcd 2M 64k")  # data only this guest's disk has
    cloud.openstack("server", "start", sid, as_json=False)
    await until_server(cloud, sid, "ACTIVE")

    cloud.openstack("server", "image", "create", "--name", "snap-libvirt", "--wait", sid)
    image = cloud.openstack("image", "show", "snap-libvirt")
    saved = tmp_path / "snap.qcow2"
    cloud.openstack("image", "save", "--file", str(saved), "snap-libvirt", as_json=False)

    assert image["status"] == "active"
    assert image["disk_format"] == "qcow2"
    assert image["properties"]["instance_uuid"] == sid
    verified = qemu_io(saved, "read -P 0xcd 2M 64k", read_only=True)
    assert "Pattern verification failed" not in verified
    assert cloud.openstack("server", "show", sid)["status"] == "ACTIVE"
    assert domain_state(cloud, host, sid, libvirt_uri) == "running"
    cloud.openstack("image", "delete", "snap-libvirt", as_json=False)
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)
