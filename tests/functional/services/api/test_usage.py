"""os-simple-tenant-usage: hours from instance lifetimes, over a period, per project."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg
import httpx
import pytest

from shared.db import instances
from shared.objects.flavor import FlavorSnapshot
from tests.functional.services.api.conftest import ADMIN, MEMBER, OTHER_MEMBER, at

pytestmark = pytest.mark.functional

SMALL = FlavorSnapshot(
    flavorid="2", name="m1.small", vcpus=2, memory_mb=2048, root_gb=20, ephemeral_gb=5
)
PERIOD = {"start": "2024-05-01T00:00:00", "end": "2024-05-02T00:00:00"}


async def add_instance(
    pool: asyncpg.Pool,
    project: str,
    name: str,
    launched: str | None,
    terminated: str | None = None,
) -> str:
    async with pool.acquire() as conn:
        instance = await instances.create(
            conn,
            instance_uuid=uuid.uuid4(),
            project_id=project,
            user_id="someone",
            display_name=name,
            flavor=SMALL,
            image_ref="",
            availability_zone=None,
        )
        await conn.execute(
            """UPDATE instances
                  SET launched_at = $2, terminated_at = $3, deleted_at = $3,
                      created_at = coalesce($2, created_at),
                      vm_state = CASE WHEN $3::timestamptz IS NULL THEN 'active' ELSE 'deleted' END
                WHERE uuid = $1""",
            instance.uuid,
            None if launched is None else datetime.fromisoformat(launched).replace(tzinfo=UTC),
            None if terminated is None else datetime.fromisoformat(terminated).replace(tzinfo=UTC),
        )
    return str(instance.uuid)


@pytest.fixture
async def history(db_pool: asyncpg.Pool) -> dict[str, str]:
    return {
        # 6 hours inside the period, then deleted.
        "short": await add_instance(
            db_pool, "team", "short", "2024-05-01T06:00:00", "2024-05-01T12:00:00"
        ),
        # Started before the period, still running: the whole 24 hours.
        "long": await add_instance(db_pool, "team", "long", "2024-04-01T00:00:00"),
        # Another project, 12 hours within the period.
        "theirs": await add_instance(
            db_pool, "elsewhere", "theirs", "2024-05-01T12:00:00", "2024-05-02T06:00:00"
        ),
        # Deleted before the period; never launched: neither counts.
        "old": await add_instance(
            db_pool, "team", "old", "2024-03-01T00:00:00", "2024-03-02T00:00:00"
        ),
        "failed": await add_instance(db_pool, "team", "failed", None),
    }


async def test_list_sums_each_project_over_the_period(
    client: httpx.AsyncClient, history: dict[str, str]
) -> None:
    response = await client.get(
        "/v2.1/os-simple-tenant-usage", params={**PERIOD, "detailed": "1"}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    usages = {u["tenant_id"]: u for u in response.json()["tenant_usages"]}
    assert set(usages) == {"team", "elsewhere"}
    team = usages["team"]
    assert team["total_hours"] == pytest.approx(30.0)
    assert team["total_vcpus_usage"] == pytest.approx(60.0)
    assert team["total_memory_mb_usage"] == pytest.approx(30 * 2048)
    assert team["total_local_gb_usage"] == pytest.approx(30 * 25)
    assert team["start"] == "2024-05-01T00:00:00.000000"
    servers = {s["name"]: s for s in team["server_usages"]}
    assert set(servers) == {"short", "long"}
    assert servers["short"]["state"] == "terminated"
    assert servers["short"]["uptime"] == 6 * 3600
    assert servers["long"]["state"] == "active"
    assert servers["long"]["ended_at"] is None
    assert servers["short"]["local_gb"] == 25
    assert usages["elsewhere"]["total_hours"] == pytest.approx(12.0)

    summary = await client.get("/v2.1/os-simple-tenant-usage", params=PERIOD, headers=ADMIN)
    assert "server_usages" not in summary.json()["tenant_usages"][0]


async def test_show_is_for_the_projects_members_and_admins(
    client: httpx.AsyncClient, history: dict[str, str]
) -> None:
    own = await client.get("/v2.1/os-simple-tenant-usage/team", params=PERIOD, headers=MEMBER)
    assert own.status_code == 200
    usage = own.json()["tenant_usage"]
    assert usage["total_hours"] == pytest.approx(30.0)
    assert len(usage["server_usages"]) == 2
    other = await client.get(
        "/v2.1/os-simple-tenant-usage/team", params=PERIOD, headers=OTHER_MEMBER
    )
    assert other.status_code == 403
    assert (await client.get("/v2.1/os-simple-tenant-usage", headers=MEMBER)).status_code == 403
    empty = await client.get("/v2.1/os-simple-tenant-usage/nobody", params=PERIOD, headers=ADMIN)
    assert empty.json()["tenant_usage"] == {}


async def test_pages_over_servers_from_2_40(
    client: httpx.AsyncClient, history: dict[str, str]
) -> None:
    first = await client.get(
        "/v2.1/os-simple-tenant-usage",
        params={**PERIOD, "detailed": "1", "limit": "2"},
        headers=at("2.40", ADMIN),
    )
    page = first.json()
    assert sum(len(u["server_usages"]) for u in page["tenant_usages"]) == 2
    assert "marker=" in page["tenant_usages_links"][0]["href"]
    marker = page["tenant_usages"][-1]["server_usages"][-1]["instance_id"]
    rest = await client.get(
        "/v2.1/os-simple-tenant-usage",
        params={**PERIOD, "detailed": "1", "marker": marker},
        headers=at("2.40", ADMIN),
    )
    assert sum(len(u["server_usages"]) for u in rest.json()["tenant_usages"]) == 1


@pytest.mark.parametrize(
    "params",
    [
        {"start": "yesterday"},
        {"start": "2024-05-02T00:00:00", "end": "2024-05-01T00:00:00"},
        {**PERIOD, "marker": "not-a-server"},
    ],
)
async def test_bad_periods_are_400(client: httpx.AsyncClient, params: dict[str, str]) -> None:
    response = await client.get(
        "/v2.1/os-simple-tenant-usage", params=params, headers=at("2.40", ADMIN)
    )
    assert response.status_code == 400
