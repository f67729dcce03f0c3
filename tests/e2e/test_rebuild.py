"""Rebuild with the real openstack CLI: the guest is made again from another image on its
own host, keeping its addresses; a SHUTOFF server stays SHUTOFF; an agent that is down
refuses it with nothing changed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from shared.db import images
from tests.e2e.cloud import Cloud
from tests.e2e.test_compute_cloud import wait_for_status

pytestmark = pytest.mark.e2e

OTHER_IMAGE = uuid.UUID("9f0c1a8e-3b52-4d6a-a1e4-5b2c7d8e9f01")


def guest_spec(cloud: Cloud, server: dict[str, Any]) -> dict[str, Any]:
    """What the local driver made the guest from (its metadata file)."""
    host = server["OS-EXT-SRV-ATTR:host"]
    path: Path = cloud.state_dir(host) / "instances" / server["id"] / "metadata.json"
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


async def other_image(cloud: Cloud) -> str:
    async with cloud.pool.acquire() as conn:
        if await conn.fetchval("SELECT 1 FROM images WHERE id = $1", OTHER_IMAGE) is None:
            await images.create(conn, image_id=OTHER_IMAGE, name="cirros-alt", min_disk=1)
    return str(OTHER_IMAGE)


async def test_rebuild_makes_the_guest_again_from_the_new_image_and_keeps_addresses(
    cloud: Cloud,
) -> None:
    image = await other_image(cloud)
    created = await cloud.create_server("rebuilt")
    sid = created["id"]
    before = guest_spec(cloud, created)

    answer = cloud.openstack(
        "--os-compute-api-version", "2.57", "server", "rebuild", "--image", "cirros-alt",
        "--name", "rebuilt-again", "--property", "role=db", sid,
    )  # fmt: skip
    assert wait_for_status(cloud, sid, {"ACTIVE", "ERROR"})["status"] == "ACTIVE"
    shown = (await cloud.get(f"servers/{sid}"))["server"]
    after = guest_spec(cloud, shown)

    assert answer["id"] == sid
    assert shown["status"] == "ACTIVE"
    assert shown["image"]["id"] == image
    assert shown["name"] == "rebuilt-again"
    assert shown["metadata"] == {"role": "db"}
    assert shown["addresses"] == created["addresses"]
    assert shown["OS-EXT-SRV-ATTR:host"] == created["OS-EXT-SRV-ATTR:host"]
    assert before["image_ref"] != image
    assert after["image_ref"] == image
    assert after["addresses"] == before["addresses"]
    events = cloud.openstack("server", "event", "list", sid)
    assert events[0]["Action"] == "rebuild"
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)


async def test_a_shutoff_server_is_rebuilt_shut_off(cloud: Cloud) -> None:
    image = await other_image(cloud)
    created = await cloud.create_server("rebuilt-off")
    sid = created["id"]
    cloud.openstack("server", "stop", sid, as_json=False)
    wait_for_status(cloud, sid, {"SHUTOFF"})

    cloud.openstack("server", "rebuild", "--image", image, sid)
    assert wait_for_status(cloud, sid, {"SHUTOFF", "ERROR"})["status"] == "SHUTOFF"
    shown = (await cloud.get(f"servers/{sid}"))["server"]

    assert shown["status"] == "SHUTOFF"
    assert shown["OS-EXT-STS:power_state"] == 4
    assert guest_spec(cloud, shown)["image_ref"] == image
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)
