"""A server's host name (2.90, fully qualified from 2.94): asked for, kept, shown, served.

The host name is asked for on create or update, kept on the server (a rename leaves it),
shown to everyone from 2.90 as ``OS-EXT-SRV-ATTR:hostname``, filtered on by members from
2.90, and told to the guest by the metadata service.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from services.api.metadata.app import create_metadata_app
from shared.config import MetadataSettings
from shared.guest_metadata import signature
from tests.functional.services.api.conftest import ADMIN, MEMBER, Recorder, add_image, at
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

SECRET = "metadata-secret-0123456789"


@pytest.fixture
async def metadata(db_pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    app = create_metadata_app(MetadataSettings(bind="127.0.0.1:8775", secret=SECRET), db_pool)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://169.254.169.254"
    ) as http:
        yield http


async def create(
    client: httpx.AsyncClient, version: str, name: str = "Web Server", **fields: Any
) -> httpx.Response:
    return await client.post(
        "/v2.1/servers", headers=at(version, MEMBER), json=server_body(name, **fields)
    )


async def shown(client: httpx.AsyncClient, server_id: str, version: str) -> dict[str, Any]:
    answer = await client.get(f"/v2.1/servers/{server_id}", headers=at(version, MEMBER))
    assert answer.status_code == 200, answer.text
    server: dict[str, Any] = answer.json()["server"]
    return server


async def guest_hostname(metadata: httpx.AsyncClient, server_id: str) -> str:
    headers = {"X-Instance-ID": server_id, "X-Instance-ID-Signature": signature(SECRET, server_id)}
    meta = await metadata.get("/openstack/latest/meta_data.json", headers=headers)
    assert meta.status_code == 200, meta.text
    name: str = meta.json()["hostname"]
    return name


async def test_a_requested_hostname_is_kept_shown_to_members_and_told_to_the_guest(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    metadata: httpx.AsyncClient,
) -> None:
    await add_image(db_pool)
    made = await create(client, "2.90", hostname="db-primary")
    assert made.status_code == 202, made.text
    server_id = made.json()["server"]["id"]
    assert (await shown(client, server_id, "2.90"))["OS-EXT-SRV-ATTR:hostname"] == "db-primary"
    assert "OS-EXT-SRV-ATTR:hostname" not in await shown(client, server_id, "2.89")
    assert await guest_hostname(metadata, server_id) == "db-primary"

    renamed = await client.put(
        f"/v2.1/servers/{server_id}", headers=at("2.90", MEMBER), json={"server": {"name": "x"}}
    )
    assert renamed.json()["server"]["OS-EXT-SRV-ATTR:hostname"] == "db-primary"
    changed = await client.put(
        f"/v2.1/servers/{server_id}",
        headers=at("2.90", MEMBER),
        json={"server": {"hostname": "db-replica"}},
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["server"]["OS-EXT-SRV-ATTR:hostname"] == "db-replica"
    assert await guest_hostname(metadata, server_id) == "db-replica"
    too_early = await client.put(
        f"/v2.1/servers/{server_id}",
        headers=at("2.89", MEMBER),
        json={"server": {"hostname": "db-other"}},
    )
    assert too_early.status_code == 400
    assert "'hostname' was unexpected" in too_early.json()["badRequest"]["message"]

    listed = await client.get("/v2.1/servers?hostname=^db-rep", headers=at("2.90", MEMBER))
    assert [s["id"] for s in listed.json()["servers"]] == [server_id]
    ignored = await client.get("/v2.1/servers?hostname=^nomatch", headers=at("2.89", MEMBER))
    assert [s["id"] for s in ignored.json()["servers"]] == [server_id]


async def test_without_a_request_the_hostname_is_made_from_the_name_when_created(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    made = await create(client, "2.90", "Web Server_1")
    server_id = made.json()["server"]["id"]
    await client.put(
        f"/v2.1/servers/{server_id}", headers=at("2.90", MEMBER), json={"server": {"name": "y"}}
    )
    assert (await shown(client, server_id, "2.90"))["OS-EXT-SRV-ATTR:hostname"] == "web-server-1"
    admin = await client.get(f"/v2.1/servers/{server_id}", headers=at("2.3", ADMIN))
    assert admin.json()["server"]["OS-EXT-SRV-ATTR:hostname"] == "web-server-1"


@pytest.mark.parametrize(
    ("version", "hostname", "status"),
    [
        ("2.89", "web", 400),
        ("2.90", "web-1", 202),
        ("2.90", "w", 400),
        ("2.90", "-web", 400),
        ("2.90", "web.example.com", 400),
        ("2.90", "x" * 64, 400),
        ("2.90", 7, 400),
        ("2.90", None, 400),
        ("2.93", "web.example.com", 400),
        ("2.94", "web.example.com", 202),
        ("2.94", "w", 202),
        ("2.94", "under_score.example", 202),
        ("2.94", "x" * 256, 400),
        ("2.94", "web/1", 400),
    ],
)
async def test_which_hostnames_each_version_takes(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    *,
    conductor: Recorder,
    version: str,
    hostname: object,
    status: int,
) -> None:
    await add_image(db_pool)
    answer = await create(client, version, hostname=hostname)
    assert answer.status_code == status, answer.text


async def test_one_hostname_is_not_given_to_many_servers(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    answer = await create(client, "2.90", hostname="web", min_count=1, max_count=2)
    assert answer.status_code == 400
    expected = "Unable to allocate a single hostname to multiple instances"
    assert answer.json()["badRequest"]["message"] == expected
    listed = await client.get("/v2.1/servers", headers=at("2.90", MEMBER))
    assert listed.json()["servers"] == []


async def test_two_updates_of_the_hostname_at_once_leave_one_of_them(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = (await create(client, "2.90")).json()["server"]["id"]

    async def set_to(name: str) -> int:
        answer = await client.put(
            f"/v2.1/servers/{server_id}",
            headers=at("2.94", MEMBER),
            json={"server": {"hostname": name}},
        )
        return answer.status_code

    assert list(await asyncio.gather(set_to("a.example"), set_to("b.example"))) == [200, 200]
    final = (await shown(client, server_id, "2.94"))["OS-EXT-SRV-ATTR:hostname"]
    assert final in ("a.example", "b.example")
