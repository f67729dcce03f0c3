"""Every documented server-list filter is honoured (what it excludes is absent) or a 400."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.db import instances
from shared.objects.states import TaskState
from tests.functional.services.api.conftest import (
    ADMIN,
    IMAGE_ID,
    MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

OTHER_IMAGE = UUID("22222222-2222-3333-4444-555555555555")
PAST = (datetime.now(UTC) - timedelta(days=1)).isoformat()
FUTURE = (datetime.now(UTC) + timedelta(days=1)).isoformat()


async def post(client: httpx.AsyncClient, headers: dict[str, str], **fields: Any) -> str:
    response = await client.post(
        "/v2.1/servers", headers=at("2.73", headers), json=server_body(**fields)
    )
    assert response.status_code == 202, response.text
    server_id: str = response.json()["server"]["id"]
    return server_id


@pytest.fixture
async def servers(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> dict[str, str]:
    """alpha (admin's, active on compute-1 in az1), beta (a member's, building), gamma (deleted)."""
    await add_image(db_pool)
    await add_image(db_pool, "other", OTHER_IMAGE)
    _, node = await add_compute(db_pool, "compute-1", zone="az1")
    alpha = await post(client, ADMIN, name="alpha", tags=["web", "prod"], description="front end")
    beta = await post(
        client, MEMBER, name="beta", flavorRef="2", imageRef=str(OTHER_IMAGE), tags=["web"],
        networks="none", block_device_mapping_v2=[],
    )  # fmt: skip
    gamma = await post(client, ADMIN, name="gamma")
    async with db_pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(alpha), host="compute-1", node="compute-1", compute_id=node.id
        )
        await instances.set_active(conn, UUID(alpha))
    assert (await client.delete(f"/v2.1/servers/{gamma}", headers=ADMIN)).status_code == 204
    return {"alpha": alpha, "beta": beta, "gamma": gamma}


async def names(
    client: httpx.AsyncClient, params: dict[str, str], headers: dict[str, str] = ADMIN
) -> set[str] | int:
    """The names listed with ``params`` (and all_tenants for admins), or the error status."""
    query = {"all_tenants": "1", **params} if headers is ADMIN else params
    response = await client.get("/v2.1/servers/detail", headers=at("2.73", headers), params=query)
    if response.status_code != 200:
        return response.status_code
    return {server["name"] for server in response.json()["servers"]}


async def test_every_documented_filter_is_honoured_or_refused(
    client: httpx.AsyncClient, servers: dict[str, str]
) -> None:
    alpha, beta, gamma = {"alpha"}, {"beta"}, {"gamma"}
    live, nobody = alpha | beta, set[str]()
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    cases: list[tuple[dict[str, str], set[str] | int]] = [
        ({}, live),
        ({"name": "^al"}, alpha),
        ({"display_name": "et"}, beta),
        ({"hostname": "alpha"}, alpha),
        ({"description": "front"}, alpha),
        ({"display_description": "^front end$"}, alpha),
        ({"status": "ACTIVE"}, alpha),
        ({"status": "BUILD"}, beta),
        ({"status": "DELETED"}, gamma),
        ({"status": "PAUSED"}, nobody),
        ({"status": "bogus"}, 400),
        ({"host": "compute-1"}, alpha),
        ({"node": "^compute"}, alpha),
        ({"flavor": "2"}, beta),
        ({"image": str(OTHER_IMAGE)}, beta),
        ({"image_ref": str(IMAGE_ID)}, alpha),
        ({"availability_zone": "az1"}, alpha),
        ({"changes-since": FUTURE}, nobody),
        ({"changes-since": PAST}, live | gamma),
        ({"changes-since": "yesterday"}, 400),
        ({"changes-before": PAST}, nobody),
        ({"changes-before": FUTURE}, live | gamma),
        ({"changes-since": FUTURE, "changes-before": PAST}, 400),
        ({"deleted": "true"}, gamma),
        ({"deleted": "False"}, live),
        ({"ip": "10.0.0.2"}, alpha),
        ({"ip": "10.9."}, nobody),
        ({"ip6": "."}, nobody),
        ({"tags": "web,prod"}, alpha),
        ({"tags-any": "prod"}, alpha),
        ({"not-tags": "web,prod"}, beta),
        ({"not-tags-any": "prod"}, beta),
        ({"locked": "false"}, live),
        ({"locked": "true"}, nobody),
        ({"locked": "maybe"}, 400),
        ({"project_id": "team"}, beta),
        ({"tenant_id": "ops"}, alpha),
        ({"user_id": "alice"}, beta),
        ({"uuid": servers["alpha"]}, alpha),
        ({"key_name": "."}, nobody),
        ({"vm_state": "active"}, alpha),
        ({"task_state": "scheduling"}, beta),
        ({"power_state": "^1$"}, alpha),
        ({"progress": "100"}, alpha),
        ({"launched_at": today}, alpha),
        ({"terminated_at": "."}, nobody),
        ({"created_at": today}, live),
        ({"launch_index": "0"}, live),
        ({"launch_index": "1"}, nobody),
        ({"reservation_id": "^r-"}, live),
        ({"reservation_id": "^nothing-"}, nobody),
        ({"kernel_id": "."}, nobody),
        ({"ramdisk_id": "."}, nobody),
        ({"locked_by": "."}, nobody),
        ({"root_device_name": "."}, nobody),
        ({"config_drive": "True"}, nobody),
        ({"access_ip_v4": "."}, nobody),
        ({"access_ip_v6": "."}, nobody),
        ({"auto_disk_config": "true"}, nobody),
        ({"soft_deleted": "true"}, live),
        ({"all_tenants": "maybe"}, 400),
        ({"metadata": "{}"}, 400),
        ({"security_groups": "default"}, 400),
        ({"_secret": "1"}, 400),
        ({"name": "("}, 400),
        ({"no-such-filter": "x"}, live),
    ]
    for params, expected in cases:
        assert await names(client, params) == expected, params


async def test_members_keep_to_their_filters_and_project(
    client: httpx.AsyncClient, servers: dict[str, str]
) -> None:
    assert await names(client, {}, MEMBER) == {"beta"}
    assert await names(client, {"host": "compute-1"}, MEMBER) == {"beta"}
    assert await names(client, {"deleted": "true"}, MEMBER) == {"beta"}
    assert await names(client, {"flavor": "1"}, MEMBER) == set()
    assert await names(client, {"tags": "web"}, MEMBER) == {"beta"}
    assert await names(client, {"status": "DELETED"}, MEMBER) == 403
    assert await names(client, {"all_tenants": "1"}, MEMBER) == 403
    assert await names(client, {"sort_key": "host"}, MEMBER) == 403


async def test_tags_and_locked_filters_need_their_microversions(
    client: httpx.AsyncClient, servers: dict[str, str]
) -> None:
    async def listed(version: str, params: dict[str, str]) -> set[str]:
        response = await client.get(
            "/v2.1/servers", headers=at(version, ADMIN), params={"all_tenants": "1", **params}
        )
        assert response.status_code == 200, response.text
        return {server["name"] for server in response.json()["servers"]}

    assert await listed("2.25", {"tags": "prod"}) == {"alpha", "beta"}
    assert await listed("2.26", {"tags": "prod"}) == {"alpha"}
    assert await listed("2.72", {"locked": "true"}) == {"alpha", "beta"}
    assert await listed("2.73", {"locked": "true"}) == set()


async def test_sort_keys_are_validated_and_pages_follow_the_sort(
    client: httpx.AsyncClient, servers: dict[str, str]
) -> None:
    async def order(params: dict[str, str]) -> list[str] | int:
        response = await client.get(
            "/v2.1/servers", headers=at("2.73", ADMIN), params={"all_tenants": "1", **params}
        )
        if response.status_code != 200:
            return response.status_code
        return [server["name"] for server in response.json()["servers"]]

    assert await order({"sort_key": "display_name", "sort_dir": "asc"}) == ["alpha", "beta"]
    assert await order({"sort_key": "display_name", "sort_dir": "desc"}) == ["beta", "alpha"]
    assert await order({"sort_key": "host", "sort_dir": "desc"}) == ["alpha", "beta"]
    assert await order({"sort_key": "vcpus"}) in (["alpha", "beta"], ["beta", "alpha"])
    assert await order({"sort_key": "bogus"}) == 400
    assert await order({"sort_key": "display_name", "sort_dir": "up"}) == 400
    both = "sort_key=display_name&sort_dir=asc&sort_dir=desc&all_tenants=1"
    response = await client.get(f"/v2.1/servers?{both}", headers=at("2.73", ADMIN))
    assert response.status_code == 400

    first = await client.get(
        "/v2.1/servers",
        headers=at("2.73", ADMIN),
        params={"all_tenants": "1", "sort_key": "display_name", "sort_dir": "asc", "limit": "1"},
    )
    [page] = first.json()["servers"]
    assert page["name"] == "alpha"
    following = first.json()["servers_links"][0]["href"]
    second = await client.get(following, headers=at("2.73", ADMIN))
    assert [s["name"] for s in second.json()["servers"]] == ["beta"]


async def test_a_placed_server_shows_its_hosts_zone(
    client: httpx.AsyncClient, servers: dict[str, str]
) -> None:
    placed = await client.get(f"/v2.1/servers/{servers['alpha']}", headers=ADMIN)
    assert placed.json()["server"]["OS-EXT-AZ:availability_zone"] == "az1"
    waiting = await client.get(f"/v2.1/servers/{servers['beta']}", headers=MEMBER)
    assert waiting.json()["server"]["OS-EXT-AZ:availability_zone"] == ""


async def test_pages_under_a_mixed_sort_add_up_to_the_whole_list(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    for name in ("b", "a", "b", "c", "a", "b"):
        await post(client, MEMBER, name=name)
    sort = "sort_key=display_name&sort_dir=desc&sort_key=created_at&sort_dir=asc"
    whole = await client.get(f"/v2.1/servers?{sort}", headers=MEMBER)
    expected = [s["id"] for s in whole.json()["servers"]]
    assert [s["name"] for s in whole.json()["servers"]] == ["c", "b", "b", "b", "a", "a"]

    seen: list[str] = []
    url = f"/v2.1/servers?{sort}&limit=2"
    while url:
        page = (await client.get(url, headers=MEMBER)).json()
        seen += [s["id"] for s in page["servers"]]
        url = page["servers_links"][0]["href"] if "servers_links" in page else ""
    assert seen == expected


async def test_statuses_that_stand_for_a_task_select_servers_in_that_task(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, servers: dict[str, str]
) -> None:
    async with db_pool.acquire() as conn:
        await instances.set_task_state(conn, UUID(servers["alpha"]), TaskState.REBOOTING)
    assert await names(client, {"status": "REBOOT"}) == {"alpha"}
    assert await names(client, {"status": "reboot"}) == {"alpha"}
    assert await names(client, {"status": "HARD_REBOOT"}) == set()
    assert await names(client, {"status": "RESIZE"}) == set()
    # As in Nova, ACTIVE is the vm state whatever the task.
    assert await names(client, {"status": "ACTIVE"}) == {"alpha"}
    response = await client.get(
        "/v2.1/servers/detail",
        headers=at("2.73", ADMIN),
        params=[("all_tenants", "1"), ("status", "REBOOT"), ("status", "BUILD")],
    )
    assert {s["name"]: s["status"] for s in response.json()["servers"]} == {
        "alpha": "REBOOT",
        "beta": "BUILD",
    }
