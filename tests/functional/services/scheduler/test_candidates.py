"""The scheduler reads candidates a page at a time; filters still decide; spreading."""

from __future__ import annotations

import logging
import random

import asyncpg
import pytest

from services.scheduler.filters import default_filters
from services.scheduler.host_manager import HostManager
from services.scheduler.manager import SchedulerManager
from services.scheduler.rpcapi import SelectDestinations
from shared.context import RequestContext
from shared.db import allocations
from shared.db.host_candidates import HostSql
from shared.exceptions import NoValidHost
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec
from tests.functional.services.scheduler.test_select_destinations import add_host, spec_for

pytestmark = pytest.mark.functional


class OnlyHost:
    """A filter with no SQL form: only Python can apply it."""

    name = "OnlyHostFilter"

    def __init__(self, host: str) -> None:
        self.host = host

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        return host.node.host == self.host

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        return None


async def select(pool: asyncpg.Pool, hosts: HostManager) -> str:
    manager = SchedulerManager(pool, hosts)
    selection = await manager.select_destinations(
        RequestContext(), SelectDestinations(spec=spec_for())
    )
    return selection.host


async def test_a_python_only_filter_reads_further_pages(db_pool: asyncpg.Pool) -> None:
    # 12 hosts, best first by free RAM; the only acceptable one is the last, on page 2.
    for number in range(12):
        await add_host(db_pool, f"h{number:02d}", memory_mb=8192 - number * 256)
    hosts = HostManager(service_down_time=60, filters=[*default_filters(), OnlyHost("h11")])
    assert hosts.page_size < 12
    assert await select(db_pool, hosts) == "h11"


async def test_no_valid_host_logs_how_many_hosts_each_filter_left(
    db_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    await add_host(db_pool, "small-1", memory_mb=1024)
    await add_host(db_pool, "small-2", memory_mb=1024)
    await add_host(db_pool, "disabled", memory_mb=65536)
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET disabled = true WHERE host = 'disabled'")
    huge = spec_for().model_copy(
        update={"flavor": spec_for().flavor.model_copy(update={"memory_mb": 4096})}
    )
    manager = SchedulerManager(db_pool, HostManager(service_down_time=60))
    with (
        caplog.at_level(logging.INFO, logger="services.scheduler"),
        pytest.raises(NoValidHost),
    ):
        await manager.select_destinations(RequestContext(), SelectDestinations(spec=huge))
    summaries = [r.getMessage() for r in caplog.records if "filter results" in r.getMessage()]
    assert len(summaries) == 1
    assert "ComputeFilter: (start: 3, end: 2)" in summaries[0]
    assert "RamFilter: (start: 2, end: 0)" in summaries[0]
    async with db_pool.acquire() as conn:
        assert await allocations.usage_drift(conn) == []


async def test_subset_spreads_the_first_choice_among_the_best(db_pool: asyncpg.Pool) -> None:
    # Four hosts well ahead of four others: with a subset of 4, requests land on several
    # of the four best (a claim does not change who the best four are), never elsewhere.
    for number in range(4):
        await add_host(db_pool, f"best{number}", memory_mb=65536 - number * 512)
        await add_host(db_pool, f"rest{number}", memory_mb=8192)
    hosts = HostManager(service_down_time=60, host_subset_size=4, rng=random.Random(7))
    chosen = [await select(db_pool, hosts) for _ in range(8)]
    assert len(set(chosen)) > 1
    assert set(chosen) <= {"best0", "best1", "best2", "best3"}
