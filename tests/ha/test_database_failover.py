"""200 boots from 20 clients while the PostgreSQL primary dies and its standby is promoted.

Replication is synchronous, so nothing the primary acknowledged is missing on the
standby. Meanwhile keel-api answers 503 and nothing else; afterwards every keel process
works on the new primary without a restart, and every server the API accepted ends
ACTIVE or ERROR exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from benchkit.ha import Stage, StageShape, ha_stage, keep_logs

from devkit.pg_cluster import PgCluster
from devkit.rabbit_cluster import RabbitCluster
from shared.db import services
from tests.ha.conftest import failed
from tests.ha.faults import assert_whole, boots_after, boots_through

pytestmark = [pytest.mark.ha, pytest.mark.timeout(900)]

#: Seconds between the primary's death and the promotion (a failover manager's delay).
PROMOTE_AFTER = 2.0


@pytest.fixture
async def stage(
    request: pytest.FixtureRequest, rabbit: RabbitCluster, postgres: PgCluster
) -> AsyncIterator[Stage]:
    async with ha_stage(rabbit, postgres, StageShape(hosts=4)) as running:
        yield running
        if failed(request):
            keep_logs(running.cloud)


async def test_boots_come_through_a_failover_to_the_standby(
    stage: Stage, postgres: PgCluster
) -> None:
    pids = stage.pids()

    async def failover() -> None:
        postgres.kill_primary()
        await asyncio.sleep(PROMOTE_AFTER)
        await postgres.promote()

    boots = await boots_through(stage, failover)

    assert set(boots.answers) <= {"202", "503"}, boots.answers
    failures = {probe.what for probe in boots.probes if not probe.ok}
    assert failures <= {"503"}, failures
    await assert_whole(stage, boots, pids)
    await boots_after(stage)
    # The old primary is dead: what keel wrote since is on the new one.
    conn = await asyncpg.connect(
        postgres.standby.dsn(stage.cloud.database_url.split("/")[-1].partition("?")[0])
    )
    try:
        found = await services.list_services(conn, stage.cloud.shape.service_down_time)
    finally:
        await conn.close()
    assert {s.binary for s in found if s.is_up} == {
        "keel-conductor",
        "keel-scheduler",
        "keel-compute",
    }
