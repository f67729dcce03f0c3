"""What a server's create asked for, shown from 2.96, 2.98 and 2.100.

2.96: the zone the create pinned the server to (``pinned_availability_zone``); 2.98: the
standard properties of its image as they were at create time (``image.properties``);
2.100: the scheduler hints it was created with (``scheduler_hints``). Each is shown in
``GET /servers/{id}``, ``GET /servers/detail`` and the answer to ``PUT /servers/{id}``.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from shared.db import images
from tests.functional.services.api.conftest import MEMBER, Recorder, add_compute, at
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

#: Boot from the image named by imageRef alone (no mapping naming the default image).
NO_BDM: dict[str, Any] = {"block_device_mapping_v2": []}

PROPERTIES = {
    "hw_disk_bus": "virtio",
    "os_distro": "cirros",
    "hw_video_ram": 64,
    "owner_specified.openstack.md5": "0123",
    "my_own_key": "mine",
}


async def image_with_properties(pool: asyncpg.Pool) -> uuid.UUID:
    async with pool.acquire() as conn:
        image = await images.create(
            conn, image_id=uuid.uuid4(), name="with-props", properties=dict(PROPERTIES)
        )
    return image.id


async def three_views(client: httpx.AsyncClient, server_id: str, version: str) -> list[Any]:
    """The server as shown, listed in detail, and answered to an update, at ``version``."""
    headers = at(version, MEMBER)
    shown = (await client.get(f"/v2.1/servers/{server_id}", headers=headers)).json()["server"]
    listed = (await client.get("/v2.1/servers/detail", headers=headers)).json()["servers"]
    [in_list] = [s for s in listed if s["id"] == server_id]
    updated = await client.put(
        f"/v2.1/servers/{server_id}", headers=headers, json={"server": {"name": "renamed"}}
    )
    assert updated.status_code == 200, updated.text
    return [shown, in_list, updated.json()["server"]]


async def test_the_pinned_zone_the_image_properties_and_the_hints_are_shown(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_compute(db_pool, "asked-1", zone="az-east")
    image_id = await image_with_properties(db_pool)
    body = {
        **server_body("asked", imageRef=str(image_id), availability_zone="az-east", **NO_BDM),
        "os:scheduler_hints": {"same_host": "a", "different_host": ["b", "c"], "build": 1},
    }
    made = await client.post("/v2.1/servers", headers=at("2.100", MEMBER), json=body)
    assert made.status_code == 202, made.text
    server_id = made.json()["server"]["id"]
    async with db_pool.acquire() as conn:
        # The image changes afterwards: the server keeps what it had.
        await conn.execute("UPDATE images SET properties = '{}' WHERE id = $1", image_id)

    for view in await three_views(client, server_id, "2.100"):
        assert view["pinned_availability_zone"] == "az-east"
        assert view["image"]["properties"] == {
            "hw_disk_bus": "virtio",
            "os_distro": "cirros",
            "hw_video_ram": "64",
        }
        assert view["scheduler_hints"] == {
            "same_host": ["a"],
            "different_host": ["b", "c"],
            "build": ["1"],
        }
    for view in await three_views(client, server_id, "2.95"):
        assert "pinned_availability_zone" not in view
        assert "properties" not in view["image"]
        assert "scheduler_hints" not in view


async def test_a_server_created_without_them_shows_null_and_empty(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_compute(db_pool, "asked-2")
    image_id = await image_with_properties(db_pool)
    made = await client.post(
        "/v2.1/servers",
        headers=at("2.1", MEMBER),
        json=server_body("plain", imageRef=str(image_id), **NO_BDM),
    )
    server_id = made.json()["server"]["id"]
    for view in await three_views(client, server_id, "2.100"):
        assert view["pinned_availability_zone"] is None
        assert view["scheduler_hints"] == {}
        assert view["image"]["properties"]["os_distro"] == "cirros"
