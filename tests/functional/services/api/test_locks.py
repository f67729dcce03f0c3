"""Server locks through the API: who may lock and unlock, and what a lock refuses."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


async def action(
    client: httpx.AsyncClient, server: str, headers: dict[str, str], **body: Any
) -> httpx.Response:
    return await client.post(f"/v2.1/servers/{server}/action", headers=headers, json=body)


async def shown(client: httpx.AsyncClient, server: str) -> dict[str, Any]:
    found: dict[str, Any] = (
        await client.get(f"/v2.1/servers/{server}", headers=at("2.73", MEMBER))
    ).json()["server"]
    return found


async def test_a_locked_server_refuses_its_owner_but_not_an_admin(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server = await create(client)
    twice = await asyncio.gather(
        action(client, server, at("2.73", MEMBER), lock={"locked_reason": "maintenance"}),
        action(client, server, at("2.73", MEMBER), lock={"locked_reason": "maintenance"}),
    )
    assert [a.status_code for a in twice] == [202, 202]
    assert (await shown(client, server))["locked"] is True
    assert (await shown(client, server))["locked_reason"] == "maintenance"

    for refused in (
        await action(client, server, MEMBER, reboot={"type": "HARD"}),
        await client.delete(f"/v2.1/servers/{server}", headers=MEMBER),
        await client.put(
            f"/v2.1/servers/{server}/metadata/k", headers=MEMBER, json={"meta": {"k": "v"}}
        ),
    ):
        assert refused.status_code == 409, refused.text
        assert f"Instance {server} is locked" in refused.json()["conflictingRequest"]["message"]
    listed = await client.get("/v2.1/servers?locked=true", headers=at("2.73", MEMBER))
    assert [s["id"] for s in listed.json()["servers"]] == [server]
    unlocked_only = await client.get("/v2.1/servers?locked=false", headers=at("2.73", MEMBER))
    assert unlocked_only.json()["servers"] == []

    assert (await action(client, server, MEMBER, unlock=None)).status_code == 202
    assert (await shown(client, server))["locked"] is False
    assert (await shown(client, server))["locked_reason"] is None


async def test_an_owner_cannot_unlock_what_an_admin_locked(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server = await create(client)
    assert (await action(client, server, ADMIN, lock=None)).status_code == 202
    refused = await action(client, server, MEMBER, unlock=None)
    assert refused.status_code == 403
    old = await action(client, server, at("2.72", ADMIN), lock={"locked_reason": "x"})
    assert old.status_code == 400
    assert (await action(client, server, ADMIN, unlock=None)).status_code == 202
    assert (await shown(client, server))["locked"] is False
