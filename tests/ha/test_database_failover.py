"""200 boots from 20 clients while the PostgreSQL primary dies and Patroni promotes its
standby, without anyone's command.

Replication is synchronous (Patroni's ``synchronous_mode``), so nothing the primary
acknowledged is missing on the standby. Meanwhile keel-api answers 503 and nothing else;
afterwards every keel process works on the new primary without a restart, and every
server the API accepted ends ACTIVE or ERROR exactly once.
"""

from __future__ import annotations

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

#: Seconds Patroni may take to promote the standby (it takes about three).
PROMOTED_WITHIN = 15.0
#: Seconds the old primary may take to come back as the synchronous standby: Patroni
#: rewinds and restarts it on its own loop, which a loaded machine slows most (it once
#: took over 90 s while the other tiers ran beside it).
REJOINED_WITHIN = 240.0


@pytest.fixture
async def stage(
    request: pytest.FixtureRequest, rabbit: RabbitCluster, postgres: PgCluster
) -> AsyncIterator[Stage]:
    async with ha_stage(rabbit, postgres, StageShape(hosts=4)) as running:
        yield running
        if failed(request):
            keep_logs(running.cloud)


async def test_boots_come_through_a_failover_patroni_makes_on_its_own(
    stage: Stage, postgres: PgCluster
) -> None:
    pids = stage.pids()
    old, new = postgres.primary, postgres.standby
    took: list[float] = []

    async def failover() -> None:
        postgres.kill_primary()
        took.append(await postgres.await_failover())

    boots = await boots_through(stage, failover)

    assert postgres.primary is new
    assert took[0] <= PROMOTED_WITHIN

    assert set(boots.answers) <= {"202", "503"}, boots.answers
    failures = {probe.what for probe in boots.probes if not probe.ok}
    assert failures <= {"503"}, failures
    await assert_whole(stage, boots, pids)
    await boots_after(stage)
    # What keel wrote since is on the new primary, and the old one follows it again.
    await postgres.await_synchronous(timeout=REJOINED_WITHIN)
    assert await old.in_recovery() is True
    conn = await asyncpg.connect(new.dsn(stage.cloud.database_url.split("/")[-1].partition("?")[0]))
    try:
        found = await services.list_services(conn, stage.cloud.shape.service_down_time)
    finally:
        await conn.close()
    assert {s.binary for s in found if s.is_up} == {
        "keel-conductor",
        "keel-scheduler",
        "keel-compute",
    }
