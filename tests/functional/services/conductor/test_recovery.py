"""Automatic evacuation of fenced hosts: the conductors' recovery sweep, real PostgreSQL.

Hosts, servers and heartbeats are rows as agents and keel-api would have left them; the
sweep's casts go to a recording conductor client, so each test sees exactly which
evacuations a sweep started. Sweeps run twice at once, as two conductors run them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from services.conductor.recovery import RECOVERY_USER, Recovery
from services.conductor.rpcapi import ConductorAPI
from shared.config import FencingSettings, RecoverySettings, Settings
from shared.context import RequestContext
from shared.db import compute_nodes, instances, recoveries, services
from shared.exceptions import MessagingTimeout
from shared.metrics import Metrics
from shared.objects.migration import MigrationStatus
from shared.objects.states import TaskState
from shared.rpc.fake import FakeTransport
from shared.versions import SERVICE_VERSION
from tests.functional.services.conductor.stand_in import create_instance, resources

pytestmark = pytest.mark.functional

DOWN, FENCE, MARGIN = 4.0, 8.0, 2.0
FENCED = FENCE + MARGIN + 1


class RecordingConductor(ConductorAPI):
    """Records the evacuations cast; with ``failing``, that many casts fail first."""

    def __init__(self) -> None:
        super().__init__(FakeTransport())
        self.evacuations: list[UUID] = []
        self.failing = 0

    async def evacuate_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        if self.failing:
            self.failing -= 1
            raise MessagingTimeout("the broker did not confirm the message")
        self.evacuations.append(migration_uuid)


@dataclass
class World:
    pool: asyncpg.Pool
    conductor: RecordingConductor
    metrics: Metrics

    def recovery(self, mode: str = "tagged", hosts_per_minute: float = 6000.0) -> Recovery:
        settings = Settings(
            service_down_time=DOWN,
            report_interval=1,
            fencing=FencingSettings(margin=MARGIN),
            recovery=RecoverySettings(
                auto_evacuate=mode,  # type: ignore[arg-type]
                hosts_per_minute=hosts_per_minute,
            ),
        )
        return Recovery(self.pool, self.conductor, settings, self.metrics)

    async def host(self, name: str, zone: str = "nova") -> int:
        """A compute host of this release, its fence armed, up; its node's id."""
        async with self.pool.acquire() as conn:
            service = await services.get_or_create(
                conn,
                host=name,
                binary="keel-compute",
                topic="compute",
                version=SERVICE_VERSION,
                down_time=DOWN,
                registering=True,
                self_fence_after=FENCE,
            )
            await services.heartbeat(
                conn,
                service.uuid,
                SERVICE_VERSION,
                agent=True,
                self_fence_after=FENCE,
                fence_lease=FENCE,
            )
            node = await compute_nodes.upsert(
                conn,
                node_uuid=uuid.uuid4(),
                service_id=service.id,
                host=name,
                resources=resources(name).model_copy(update={"availability_zone": zone}),
            )
        return node.id

    async def server(self, node_id: int, *, tagged: bool = True) -> UUID:
        """An ACTIVE server on the node, with ``HA_Enabled=True`` if ``tagged``."""
        server = await create_instance(self.pool)
        async with self.pool.acquire() as conn:
            node = await compute_nodes.get_by_id(conn, node_id)
            await instances.set_scheduled(
                conn, server, host=node.host, node=node.hypervisor_hostname, compute_id=node.id
            )
            await instances.set_active(conn, server)
            if tagged:
                await conn.execute(
                    """UPDATE instances SET metadata = '{"HA_Enabled": "True"}'::jsonb
                        WHERE uuid = $1""",
                    server,
                )
        return server

    async def silent(self, name: str, seconds: float, *, fence: float | None = FENCE) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                """UPDATE services SET last_seen_up = now() - make_interval(secs => $2),
                                       self_fence_after = $3, fence_lease = $3
                    WHERE host = $1 AND "binary" = 'keel-compute'""",
                name,
                seconds,
                fence,
            )

    async def evacuated(self) -> dict[UUID, str]:
        """Server → the user its evacuation record names, for every evacuation recorded."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT instance_uuid, user_id, status FROM migrations ORDER BY id"
            )
        assert all(row["status"] == MigrationStatus.ACCEPTED for row in rows)
        return {row["instance_uuid"]: row["user_id"] for row in rows}

    def refused(self, reason: str) -> float:
        return self.metrics.value("keel_auto_evacuations_refused_total", reason=reason)


@pytest.fixture
def world(db_pool: asyncpg.Pool) -> World:
    return World(db_pool, RecordingConductor(), Metrics())


async def five_hosts(world: World) -> dict[str, tuple[UUID, UUID]]:
    """Five hosts, each with a tagged and an untagged server: name → (tagged, untagged)."""
    placed = {}
    for index in range(1, 6):
        node = await world.host(f"cn{index}")
        placed[f"cn{index}"] = (await world.server(node), await world.server(node, tagged=False))
    return placed


async def test_a_fenced_hosts_tagged_servers_are_evacuated_by_the_system(world: World) -> None:
    placed = await five_hosts(world)
    recovery = world.recovery()
    assert await recovery.sweep() == 0

    await world.silent("cn1", FENCED)
    twins = await asyncio.gather(recovery.sweep(), world.recovery().sweep())

    tagged, untagged = placed["cn1"]
    assert sorted(twins) == [0, 1]
    assert await world.evacuated() == {tagged: RECOVERY_USER}
    assert len(world.conductor.evacuations) == 1
    async with world.pool.acquire() as conn:
        assert (await instances.get(conn, tagged)).task_state == TaskState.REBUILDING
        assert (await instances.get(conn, untagged)).task_state is None
        action = await conn.fetchrow(
            "SELECT action, user_id FROM instance_actions WHERE instance_uuid = $1"
            " AND action = 'evacuate'",
            tagged,
        )
    assert action is not None
    assert (action["action"], action["user_id"]) == ("evacuate", RECOVERY_USER)
    assert world.metrics.value("keel_auto_evacuations_started_total") == 1
    assert world.metrics.value("keel_hosts_fenced") == 1
    assert await recovery.sweep() == 0, "nothing left to evacuate there"


async def test_all_takes_every_server_and_off_takes_none(world: World) -> None:
    placed = await five_hosts(world)
    await world.silent("cn2", FENCED)

    assert await world.recovery(mode="off").sweep() == 0
    assert await world.evacuated() == {}
    assert world.metrics.value("keel_hosts_fenced") == 1

    assert await world.recovery(mode="all").sweep() == 2
    assert set(await world.evacuated()) == set(placed["cn2"])


async def test_a_host_not_yet_fenced_waits(world: World) -> None:
    await five_hosts(world)
    await world.silent("cn3", FENCE)  # down, inside the lease and margin

    assert await world.recovery().sweep() == 0
    assert await world.evacuated() == {}


async def test_hosts_are_taken_one_at_a_time_at_the_pace_asked(world: World) -> None:
    placed = await five_hosts(world)
    await world.silent("cn1", FENCED + 5)
    await world.silent("cn2", FENCED)
    slow = world.recovery(hosts_per_minute=1)

    assert await slow.sweep() == 1
    assert await slow.sweep() == 0
    assert set(await world.evacuated()) == {placed["cn1"][0]}, "the longest silent first"

    async with world.pool.acquire() as conn:
        await conn.execute("UPDATE host_recoveries SET started_at = now() - interval '61 s'")
    assert await slow.sweep() == 1
    assert set(await world.evacuated()) == {placed["cn1"][0], placed["cn2"][0]}


async def test_too_many_hosts_down_in_a_zone_evacuates_nothing_and_says_why(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await five_hosts(world)
    for name in ("cn1", "cn2", "cn3"):
        await world.silent(name, FENCED)
    recovery = world.recovery()

    with caplog.at_level(logging.WARNING):
        assert await recovery.sweep() == 0
        assert await recovery.sweep() == 0

    assert await world.evacuated() == {}
    warned = [r for r in caplog.records if "not evacuating any server" in r.getMessage()]
    assert len(warned) == 1, "said once, when it starts"
    assert "3 of its 5 compute hosts are down" in warned[0].getMessage()
    assert world.refused("zone_down_fraction") == 6
    assert world.metrics.value("keel_hosts_fenced") == 3


async def test_a_zone_of_its_own_is_judged_by_its_own_hosts(world: World) -> None:
    await five_hosts(world)
    far = [await world.host(f"far{i}", zone="far") for i in range(3)]
    tagged = await world.server(far[0])
    await world.silent("far0", FENCED)

    assert await world.recovery().sweep() == 1
    assert set(await world.evacuated()) == {tagged}


async def test_a_host_whose_agent_does_not_fence_itself_is_never_taken(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await five_hosts(world)
    await world.silent("cn4", 3600, fence=0)
    recovery = world.recovery()

    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert await recovery.sweep() == 0

    assert await world.evacuated() == {}
    assert world.refused("not_self_fencing") == 1
    assert sum("KEEL_FENCING__SELF_FENCE_AFTER=0" in r.getMessage() for r in caplog.records) == 1


async def test_an_evacuation_whose_cast_fails_is_withdrawn_and_taken_again_later(
    world: World,
) -> None:
    placed = await five_hosts(world)
    await world.silent("cn5", FENCED)
    world.conductor.failing = 1

    assert await world.recovery().sweep() == 0
    async with world.pool.acquire() as conn:
        statuses = [r["status"] for r in await conn.fetch("SELECT status FROM migrations")]
        assert (await instances.get(conn, placed["cn5"][0])).task_state is None
        await conn.execute("UPDATE host_recoveries SET started_at = now() - interval '61 s'")
    assert statuses == [MigrationStatus.ERROR]
    assert world.refused("cast_failed") == 1

    assert await world.recovery().sweep() == 1
    assert len(world.conductor.evacuations) == 1


async def test_a_sweep_whose_database_call_fails_leaves_no_lock_behind(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    placed = await five_hosts(world)
    await world.silent("cn1", FENCED)
    real = recoveries.evacuable
    failures = [asyncpg.ConnectionDoesNotExistError("connection was closed in the middle")]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await real(*args, **kwargs)

    monkeypatch.setattr(recoveries, "evacuable", flaky)
    recovery = world.recovery()
    with pytest.raises(asyncpg.ConnectionDoesNotExistError):
        await recovery.sweep()

    async with world.pool.acquire() as conn:
        held = await conn.fetchval(
            """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1
                  AND database = (SELECT oid FROM pg_database
                                   WHERE datname = current_database())""",
            recoveries.LOCK_KEY,
        )
    assert held == 0
    assert await recovery.sweep() == 1, "the next sweep takes the lock and the host"
    assert set(await world.evacuated()) == {placed["cn1"][0]}
