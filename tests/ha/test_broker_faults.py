"""200 boots from 20 clients while a RabbitMQ node dies, or every node restarts in turn.

The cloud runs two of each control service and four agents on a three-node cluster.
Every server the API accepted must end ACTIVE or ERROR exactly once (one guest on one
host for each ACTIVE one, one claim, nothing else left), every keel process must come
through without a restart, reconnecting by itself, and the cloud must boot servers
afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from benchkit.ha import Stage, StageShape, ha_stage, keep_logs

from devkit.pg_cluster import PgCluster
from devkit.rabbit_cluster import RabbitCluster
from tests.ha.conftest import failed
from tests.ha.faults import assert_whole, boots_after, boots_through

pytestmark = [pytest.mark.ha, pytest.mark.timeout(900)]


@pytest.fixture
async def stage(
    request: pytest.FixtureRequest, rabbit: RabbitCluster, postgres: PgCluster
) -> AsyncIterator[Stage]:
    async with ha_stage(rabbit, postgres, StageShape(hosts=4)) as running:
        yield running
        if failed(request):
            keep_logs(running.cloud)


async def test_boots_survive_the_death_of_the_node_leading_the_conductor_queue(
    stage: Stage, rabbit: RabbitCluster
) -> None:
    pids = stage.pids()
    queue = f"{stage.cloud.exchange}.conductor"
    leader = await rabbit.leader(queue)

    async def kill_the_leader() -> None:
        await rabbit.kill(leader)

    boots = await boots_through(stage, kill_the_leader)

    assert set(boots.answers) <= {"202", "503"}, boots.answers
    await assert_whole(stage, boots, pids)
    assert (await rabbit.leader(queue)) != leader
    await boots_after(stage)


async def test_boots_go_on_through_a_rolling_restart_of_every_node(
    stage: Stage, rabbit: RabbitCluster
) -> None:
    pids = stage.pids()

    async def rolling_restart() -> None:
        for node in rabbit.nodes:
            await rabbit.await_quorum_plus_one(node)
            await rabbit.restart(node)

    boots = await boots_through(stage, rolling_restart)

    assert set(boots.answers) <= {"202", "503"}, boots.answers
    await assert_whole(stage, boots, pids)
    await boots_after(stage)
