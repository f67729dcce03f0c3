"""Server snapshots with the real openstack CLI: ``server image create`` on a running and
on a stopped server makes an active image holding the guest's disk (the local driver's
disk file up to the end of its data), with a snapshot's properties; its owner downloads
and deletes it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cloud import Cloud
from tests.e2e.test_compute_cloud import wait_for_status

pytestmark = pytest.mark.e2e

MEMBER = "keel-member"


def disk_of(cloud: Cloud, server: dict[str, Any]) -> Path:
    host: str = server["OS-EXT-SRV-ATTR:host"]
    path: Path = cloud.state_dir(host) / "instances" / server["id"] / "disk"
    return path


WRITTEN = b"data the guest wrote"


async def snapshot_server(cloud: Cloud, name: str) -> tuple[str, dict[str, Any]]:
    created = cloud.openstack(
        "server", "create", "--flavor", "1", "--image", "cirros", "--wait", name,
        cloud=MEMBER,
    )  # fmt: skip
    shown = (await cloud.get(f"servers/{created['id']}"))["server"]
    with disk_of(cloud, shown).open("r+b") as disk:
        disk.seek(1 << 20)
        disk.write(WRITTEN)
    return created["id"], shown


async def test_a_running_server_is_snapshotted_and_its_owner_downloads_and_deletes_it(
    cloud: Cloud, tmp_path: Path
) -> None:
    sid, shown = await snapshot_server(cloud, "snapped")

    cloud.openstack("server", "image", "create", "--name", "snap-running", "--wait", sid,
                    "--property", "purpose=e2e", cloud=MEMBER)  # fmt: skip
    image = cloud.openstack("image", "show", "snap-running", cloud=MEMBER)
    server = cloud.openstack("server", "show", sid, cloud=MEMBER)
    saved = tmp_path / "snap.raw"
    cloud.openstack("image", "save", "--file", str(saved), "snap-running", cloud=MEMBER,
                    as_json=False)  # fmt: skip

    data = saved.read_bytes()
    assert image["status"] == "active"
    assert image["checksum"] == hashlib.md5(data, usedforsecurity=False).hexdigest()
    assert image["size"] == len(data)
    assert (1 << 20) + len(WRITTEN) <= len(data) < disk_of(cloud, shown).stat().st_size
    assert data[1 << 20 : (1 << 20) + len(WRITTEN)] == WRITTEN
    properties = image["properties"]
    assert properties["image_type"] == "snapshot"
    assert properties["instance_uuid"] == sid
    assert properties["purpose"] == "e2e"
    assert image["visibility"] == "private"
    assert server["status"] == "ACTIVE"
    assert server["OS-EXT-STS:task_state"] is None
    cloud.openstack("image", "delete", "snap-running", cloud=MEMBER, as_json=False)
    names = [i["Name"] for i in cloud.openstack("image", "list", cloud=MEMBER)]
    assert "snap-running" not in names
    await cloud.delete_server(sid)


async def test_a_stopped_server_is_snapshotted_and_stays_stopped(cloud: Cloud) -> None:
    sid, _ = await snapshot_server(cloud, "stopped")
    cloud.openstack("server", "stop", sid, cloud=MEMBER, as_json=False)
    assert wait_for_status(cloud, sid, {"SHUTOFF"})["status"] == "SHUTOFF"

    cloud.openstack("server", "image", "create", "--name", "snap-stopped", "--wait", sid,
                    cloud=MEMBER)  # fmt: skip

    image = cloud.openstack("image", "show", "snap-stopped", cloud=MEMBER)
    assert image["status"] == "active"
    assert image["size"] >= (1 << 20) + len(WRITTEN)
    assert cloud.openstack("server", "show", sid, cloud=MEMBER)["status"] == "SHUTOFF"
    await cloud.delete_server(sid)
