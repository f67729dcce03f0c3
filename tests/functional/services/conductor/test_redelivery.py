"""At-least-once delivery on real RabbitMQ and PostgreSQL: twins, redeliveries, poison.

Every conductor cast may be delivered twice at the same time — published twice, or
redelivered after its consumer's connection dropped mid-handle while the first delivery
carries on. Each case must end as if it had been delivered once: one claim, one host,
the instance in the right state, and a node's usage equal to its allocations.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from services.conductor.main import serve as serve_conductor
from services.conductor.rpcapi import ConductorAPI, Registration
from services.scheduler.host_manager import HostManager
from services.scheduler.manager import SchedulerManager
from services.scheduler.rpcapi import RPC_VERSION as SCHEDULER_VERSION
from services.scheduler.rpcapi import TOPIC as SCHEDULER_TOPIC
from services.scheduler.rpcapi import SelectDestinations, Selection
from shared.config import RpcSettings, Settings
from shared.context import RequestContext
from shared.db import allocations, instances
from shared.rpc.amqp import AmqpTransport
from shared.rpc.envelope import Envelope
from shared.rpc.server import RPCServer
from shared.rpc.transport import DeadLetter
from shared.runtime import Lifecycle
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.conductor.conftest import SOON, wait_for_conductor
from tests.functional.services.conductor.stand_in import (
    StandInCompute,
    create_instance,
    eventually,
    register,
    serve_stand_in,
    until,
)

pytestmark = pytest.mark.functional

KEEL_MANAGE = Path(sys.executable).parent / "keel-manage"


async def state_of(pool: asyncpg.Pool, instance_uuid: UUID) -> tuple[str, str | None]:
    async with pool.acquire() as conn:
        instance = await instances.find(conn, instance_uuid)
    assert instance is not None
    return instance.vm_state, instance.host


async def reaches(pool: asyncpg.Pool, instance_uuid: UUID, vm_state: str) -> None:
    async def check() -> bool | None:
        return True if (await state_of(pool, instance_uuid))[0] == vm_state else None

    await eventually(check)


async def accounts_balance(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        assert await allocations.usage_drift(conn) == []


async def fleet(
    conductor: ConductorAPI, transport: AmqpTransport, hosts: int = 3
) -> dict[UUID, StandInCompute]:
    """``hosts`` stand-in agents with equal room, serving and up; by service uuid."""
    agents: dict[UUID, StandInCompute] = {}
    for number in range(hosts):
        registration: Registration = await register(conductor, f"host{number}")
        agent = StandInCompute(conductor)
        await serve_stand_in(transport, registration, agent)
        agents[registration.service_uuid] = agent
    return agents


def hosts_that_built(agents: dict[UUID, StandInCompute], instance_uuid: UUID) -> set[UUID]:
    return {
        service
        for service, agent in agents.items()
        if any(s.uuid == instance_uuid for s in agent.built)
    }


async def test_build_published_twice_at_once_builds_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    agents = await fleet(conductor, agent_transport)
    instance_uuid = await create_instance(db_pool)

    ctx = RequestContext()
    await asyncio.gather(
        conductor.build_instances(ctx, instance_uuid), conductor.build_instances(ctx, instance_uuid)
    )

    await reaches(db_pool, instance_uuid, "active")
    async with db_pool.acquire() as conn:
        claims = await allocations.for_instance(conn, instance_uuid)
    assert len(claims) == 1
    assert len(hosts_that_built(agents, instance_uuid)) == 1
    await accounts_balance(db_pool)


@pytest.mark.parametrize("success", [True, False])
async def test_build_result_delivered_twice_at_once_counts_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, success: bool
) -> None:
    registration = await register(conductor, "host")
    agent = StandInCompute(conductor)
    agent.report = False
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until(lambda: bool(agent.built))

    ctx = RequestContext()
    await asyncio.gather(
        *(
            conductor.instance_build_result(ctx, instance_uuid, success=success, message="broke")
            for _ in range(2)
        )
    )

    await reaches(db_pool, instance_uuid, "active" if success else "error")
    async with db_pool.acquire() as conn:
        claims = await allocations.for_instance(conn, instance_uuid)
        finished = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'create' AND finish_time IS NOT NULL""",
            instance_uuid,
        )
    assert len(claims) == (1 if success else 0)
    assert finished == 1
    await accounts_balance(db_pool)


async def test_delete_reported_twice_at_once_releases_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    await fleet(conductor, agent_transport, hosts=1)
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await reaches(db_pool, instance_uuid, "active")

    ctx = RequestContext()
    await asyncio.gather(*(conductor.instance_deleted(ctx, instance_uuid) for _ in range(2)))

    await reaches(db_pool, instance_uuid, "deleted")
    async with db_pool.acquire() as conn:
        assert await allocations.for_instance(conn, instance_uuid) == []
    await accounts_balance(db_pool)


class GatedScheduler(SchedulerManager):
    """The real scheduler, holding every answer until the test opens the gate."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool, HostManager(service_down_time=60))
        self.gate = asyncio.Event()
        self.calls = 0

    async def select_destinations(self, ctx: RequestContext, req: SelectDestinations) -> Selection:
        self.calls += 1
        await self.gate.wait()
        return await super().select_destinations(ctx, req)


async def test_build_redelivered_after_connection_cut_mid_handle_converges(
    db_pool: asyncpg.Pool, settings: Settings, agent_transport: AmqpTransport, amqp_proxy: TcpProxy
) -> None:
    scheduler = GatedScheduler(db_pool)
    await RPCServer(agent_transport, SCHEDULER_TOPIC, scheduler, version=SCHEDULER_VERSION).start()
    lifecycle = Lifecycle()
    via_proxy = settings.model_copy(
        update={"transport_url": url_through(settings.transport_url, amqp_proxy.address)}
    )
    runs = [asyncio.create_task(serve_conductor(via_proxy, lifecycle))]
    try:
        await wait_for_conductor(agent_transport)
        conductor = ConductorAPI(agent_transport, timeout=SOON)
        agents = await fleet(conductor, agent_transport)
        instance_uuid = await create_instance(db_pool)
        await conductor.build_instances(RequestContext(), instance_uuid)
        await until(lambda: scheduler.calls == 1)

        # A second conductor joins; the first one's connection drops mid-handle. The
        # broker delivers the build again while the first handler is still running (and
        # that handler, its reply queue gone, may ask the scheduler again itself).
        runs.append(asyncio.create_task(serve_conductor(settings, lifecycle)))
        await asyncio.sleep(0.2)
        await amqp_proxy.cut()
        await amqp_proxy.restore()
        await until(lambda: scheduler.calls >= 2)
        scheduler.gate.set()

        await reaches(db_pool, instance_uuid, "active")
        async with db_pool.acquire() as conn:
            claims = await allocations.for_instance(conn, instance_uuid)
        assert len(claims) == 1
        assert len(hosts_that_built(agents, instance_uuid)) == 1
        await accounts_balance(db_pool)
    finally:
        lifecycle.stopping.set()
        await asyncio.gather(*runs)


@pytest.fixture
def impatient(settings: Settings) -> Settings:
    """Few redeliveries, short retries, and a short build deadline."""
    rpc = RpcSettings(
        queue_expires=60,
        call_timeout=2,
        connect_timeout=10,
        delivery_limit=1,
        handler_retry_timeout=0.3,
    )
    return settings.model_copy(update={"rpc": rpc, "build_timeout": 4.0})


@pytest.fixture
async def lone_conductor(
    impatient: Settings, agent_transport: AmqpTransport
) -> AsyncIterator[ConductorAPI]:
    """keel-conductor running with no scheduler anywhere: every build fails transiently."""
    lifecycle = Lifecycle()
    run = asyncio.create_task(serve_conductor(impatient, lifecycle))
    try:
        await wait_for_conductor(agent_transport)
        yield ConductorAPI(agent_transport, timeout=SOON)
    finally:
        lifecycle.stopping.set()
        await run


async def test_cast_that_keeps_failing_is_dead_lettered_and_the_deadline_ends_the_build(
    db_pool: asyncpg.Pool,
    lone_conductor: ConductorAPI,
    agent_transport: AmqpTransport,
    caplog: pytest.LogCaptureFixture,
) -> None:
    instance_uuid = await create_instance(db_pool)

    await lone_conductor.build_instances(RequestContext(), instance_uuid)

    async def dead() -> list[DeadLetter] | None:
        found = await agent_transport.dead_letters()
        return list(found) or None

    [letter] = await eventually(dead)
    assert Envelope.model_validate_json(letter.body).method == "build_instances"
    assert letter.topic == "conductor"
    assert "after 2 deliveries" in letter.detail
    assert "Unroutable" in letter.detail
    assert any("dead-lettering message" in r.getMessage() for r in caplog.records)
    # Not left in BUILD: the deadline puts it in ERROR, with nothing claimed.
    await reaches(db_pool, instance_uuid, "error")
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
        assert await allocations.for_instance(conn, instance_uuid) == []
    assert instance.fault is not None
    assert "did not finish within 4 seconds" in instance.fault.message
    # The conductor still serves.
    await wait_for_conductor(agent_transport)


def manage(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    environ.update(
        KEEL_DATABASE_URL=settings.database_url,
        KEEL_TRANSPORT_URL=settings.transport_url,
        KEEL_EXCHANGE=settings.exchange,
        KEEL_RPC__QUEUE_EXPIRES="60",
    )
    return subprocess.run(
        [str(KEEL_MANAGE), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_operator_sees_a_poison_message_with_keel_manage(
    settings: Settings, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid = "6d0f3ad8-7a51-4d1c-9f0e-3d2b1c4a5e6f"
    poison = Envelope(
        method="frobnicate",
        version="1.0",
        context=RequestContext(),
        args={"instance_uuid": instance_uuid},
    )
    await agent_transport.cast("conductor", poison.model_dump_json().encode(), message_id="p-1")
    await eventually(lambda: _listed(settings))

    listed = manage(settings, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if "frobnicate" in line)
    assert instance_uuid in line
    assert "conductor" in line
    assert "1.0" in line
    assert "NoSuchMethod" in line
    shown = manage(settings, "dlq", "show", "1")
    assert shown.returncode == 0, shown.stderr
    assert "conductor has no RPC method 'frobnicate'" in shown.stdout
    purged = manage(settings, "dlq", "purge")
    assert purged.stdout.strip() == "removed 1 dead-lettered casts"
    assert manage(settings, "dlq", "list").stdout.startswith("no dead-lettered casts")


async def _listed(settings: Settings) -> bool | None:
    result = await asyncio.to_thread(manage, settings, "dlq", "list")
    return True if "frobnicate" in result.stdout else None
