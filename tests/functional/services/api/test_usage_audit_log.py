"""os-instance_usage_audit_log: keel runs no usage audit, and says so for every host."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import httpx
import pytest

from services.api.resources.usage_audit_log import audit_period
from tests.functional.services.api.conftest import ADMIN, MEMBER, add_compute, at

pytestmark = pytest.mark.functional

ROUTE = "/v2.1/os-instance_usage_audit_log"


async def test_every_compute_host_is_reported_as_not_run(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "audit-1")
    await add_compute(db_pool, "audit-2", up=False)
    listed = await client.get(ROUTE, headers=ADMIN)
    assert listed.status_code == 200, listed.text
    log = listed.json()["instance_usage_audit_logs"]
    assert log["hosts_not_run"] == ["audit-1", "audit-2"]
    assert (log["num_hosts"], log["num_hosts_not_run"], log["num_hosts_done"]) == (2, 2, 0)
    assert (log["total_instances"], log["total_errors"], log["log"]) == (0, 0, {})
    assert log["overall_status"] == "0 of 2 hosts done. 0 errors."
    begin, end = audit_period(datetime.now(UTC).replace(tzinfo=None))
    assert (log["period_beginning"], log["period_ending"]) == (str(begin), str(end))


@pytest.mark.parametrize(
    ("before", "beginning", "ending"),
    [
        ("2024-05-17 10:20:30", "2024-04-01 00:00:00", "2024-05-01 00:00:00"),
        ("2024-05-01 00:00:00", "2024-03-01 00:00:00", "2024-04-01 00:00:00"),
        ("2024-01-09 08:00:00.250000", "2023-12-01 00:00:00", "2024-01-01 00:00:00"),
        ("2024-02-01 00:00:00", "2023-12-01 00:00:00", "2024-01-01 00:00:00"),
    ],
)
async def test_show_answers_the_month_completed_before_a_time(
    client: httpx.AsyncClient, before: str, beginning: str, ending: str
) -> None:
    shown = await client.get(f"{ROUTE}/{before.replace(' ', '%20')}", headers=ADMIN)
    assert shown.status_code == 200, shown.text
    log = shown.json()["instance_usage_audit_log"]
    assert (log["period_beginning"], log["period_ending"]) == (beginning, ending)
    assert log["overall_status"] == "ALL hosts done. 0 errors."
    assert log["hosts_not_run"] == []


@pytest.mark.parametrize(
    "before", ["invalid_time", "2024-05-17", "2024-13-01 00:00:00", "2024-05-17T10:20:30"]
)
async def test_a_bad_timestamp_is_400(client: httpx.AsyncClient, before: str) -> None:
    shown = await client.get(f"{ROUTE}/{before}", headers=ADMIN)
    assert shown.status_code == 400, shown.text
    assert "Invalid timestamp" in shown.json()["badRequest"]["message"]


async def test_members_are_refused(client: httpx.AsyncClient) -> None:
    assert (await client.get(ROUTE, headers=MEMBER)).status_code == 403
    shown = await client.get(f"{ROUTE}/2024-05-17%2010:20:30", headers=MEMBER)
    assert shown.status_code == 403


async def test_a_query_is_refused_from_2_102(client: httpx.AsyncClient) -> None:
    assert (await client.get(f"{ROUTE}?x=1", headers=at("2.101"))).status_code == 200
    assert (await client.get(f"{ROUTE}?x=1", headers=at("2.102"))).status_code == 400
