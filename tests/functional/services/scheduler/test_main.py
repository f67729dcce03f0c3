"""keel-scheduler's composition root: own service row, heartbeats, serving, clean stop."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from services.scheduler.main import serve
from services.scheduler.rpcapi import SchedulerAPI
from shared.config import RpcSettings, Settings
from shared.context import RequestContext
from shared.db import services
from shared.exceptions import NoValidHost, Unroutable
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec
from shared.objects.service import Service
from shared.runtime import Lifecycle
from shared.versions import SERVICE_VERSION
from tests.functional.services.scheduler.conftest import OpenTransport

pytestmark = pytest.mark.functional

#: Bound on waiting for something that should happen within a few report intervals.
SOON = 15.0


async def _scheduler_rows(pool: asyncpg.Pool) -> list[Service]:
    async with pool.acquire() as conn:
        return await services.list_services(conn, 60, binary="keel-scheduler")


async def test_two_schedulers_share_their_row_heartbeat_serve_and_stop(
    database_url: str,
    amqp_url: str,
    exchange: str,
    db_pool: asyncpg.Pool,
    open_transport: OpenTransport,
) -> None:
    settings = Settings(
        database_url=database_url,
        transport_url=amqp_url,
        exchange=exchange,
        host="sched-host",
        report_interval=0.2,
        rpc=RpcSettings(queue_expires=60, call_timeout=5, connect_timeout=10),
    )
    lifecycles = [Lifecycle(), Lifecycle()]
    runs = [asyncio.create_task(serve(settings, lifecycle)) for lifecycle in lifecycles]
    client = SchedulerAPI(await open_transport(), timeout=10)
    spec = RequestSpec(
        instance_uuid=uuid.uuid4(),
        project_id="p",
        user_id="u",
        flavor=FlavorSnapshot(flavorid="1", name="one", vcpus=1, memory_mb=512, root_gb=1),
    )
    try:
        async with asyncio.timeout(SOON):
            while True:
                rows = await _scheduler_rows(db_pool)
                if rows and rows[0].report_count >= 4:
                    break
                await asyncio.sleep(0.1)
            while True:
                try:
                    await client.select_destinations(RequestContext(), spec)
                except Unroutable:
                    await asyncio.sleep(0.1)
                except NoValidHost:
                    break
    finally:
        for lifecycle in lifecycles:
            lifecycle.stopping.set()
        await asyncio.gather(*runs)

    rows = await _scheduler_rows(db_pool)
    assert len(rows) == 1
    assert rows[0].host == "sched-host"
    assert rows[0].topic == "scheduler"
    assert rows[0].is_up
    assert rows[0].version == SERVICE_VERSION
