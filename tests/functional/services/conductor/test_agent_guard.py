"""An agent with its own broker user may ask the conductor only about what is its own.

Real RabbitMQ (a per-agent user made through the management API, with the permissions
``keel-manage agent credentials`` gives) and a real conductor. Agent A connects as its own
user; agent B, on another host, as the control plane's. A's valid credentials get it
nowhere with B's service, node, instance or migration: each request is refused, logged,
and changes nothing — also when it is delivered twice at once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

import asyncpg
import pytest

from services.conductor.rpcapi import ConductorAPI, Registration
from shared.context import RequestContext
from shared.db import agent_users as issued
from shared.db import instances, moves
from shared.exceptions import CallerRefused
from shared.rpc.agent_users import user_for
from shared.rpc.amqp import AmqpTransport
from shared.versions import SERVICE_VERSION
from tests.broker import agent_user
from tests.functional.services.conductor.conftest import SOON
from tests.functional.services.conductor.stand_in import (
    StandInCompute,
    create_instance,
    eventually,
    register,
    resources,
    serve_stand_in,
)

pytestmark = pytest.mark.functional

REFUSED = "rpc_refused"


@dataclass
class Agent:
    conductor: ConductorAPI
    registration: Registration
    stand_in: StandInCompute
    #: The service UUID the credentials were made for, before the agent registered.
    reserved: UUID


@pytest.fixture
async def own_agent(
    conductor: ConductorAPI, db_pool: asyncpg.Pool, exchange: str
) -> AsyncIterator[Agent]:
    """Agent A: credentials made for host guard-a, then registered through them."""
    async with db_pool.acquire() as conn, conn.transaction():
        reserved = await issued.issue(conn, "guard-a")
    async with agent_user(exchange, reserved) as url:
        transport = AmqpTransport(url, exchange, queue_expires=60, connect_timeout=10)
        await transport.connect()
        try:
            own = ConductorAPI(transport, timeout=SOON)
            registration = await register(own, "guard-a")
            stand_in = StandInCompute(own)
            await serve_stand_in(transport, registration, stand_in)
            yield Agent(own, registration, stand_in, reserved)
        finally:
            await transport.close()


async def built_on(pool: asyncpg.Pool, conductor: ConductorAPI, agent: StandInCompute) -> UUID:
    """A server built by ``agent`` (it reports the build itself), ACTIVE."""
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(RequestContext(), instance_uuid)

    async def active() -> bool | None:
        async with pool.acquire() as conn:
            found = await instances.get(conn, instance_uuid)
        return True if found.vm_state == "active" else None

    await eventually(active)
    return instance_uuid


def refusals(caplog: pytest.LogCaptureFixture, method: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if getattr(r, "decision", None) == REFUSED and getattr(r, "rpc_method", None) == method
    ]


async def test_registration_takes_the_reserved_service_uuid(own_agent: Agent) -> None:
    assert own_agent.registration.service_uuid == own_agent.reserved
    # What the agent may do: beat for itself, and report its own builds (the stand-in
    # does when the conductor asks it to build).
    await own_agent.conductor.service_heartbeat(
        RequestContext.internal(),
        service_uuid=own_agent.registration.service_uuid,
        version=SERVICE_VERSION,
    )


async def test_an_agent_cannot_report_on_another_hosts_instance(
    conductor: ConductorAPI,
    own_agent: Agent,
    db_pool: asyncpg.Pool,
    agent_transport: AmqpTransport,
    caplog: pytest.LogCaptureFixture,
) -> None:
    other = await register(conductor, "guard-b")
    other_agent = StandInCompute(conductor)
    await serve_stand_in(agent_transport, other, other_agent)
    # Only guard-b can take this build: guard-a is disabled.
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE services SET disabled = true WHERE uuid = $1",
            own_agent.registration.service_uuid,
        )
    theirs = await built_on(db_pool, conductor, other_agent)
    async with db_pool.acquire() as conn:
        before = await instances.get(conn, theirs)
    caplog.set_level(logging.WARNING)

    # Twice at once, as at-least-once delivery may hand it over.
    await asyncio.gather(
        own_agent.conductor.instance_deleted(RequestContext.internal(), theirs),
        own_agent.conductor.instance_deleted(RequestContext.internal(), theirs),
    )
    await own_agent.conductor.instance_build_result(
        RequestContext.internal(), theirs, success=False, message="forged"
    )

    async def both_refused() -> bool | None:
        done = len(refusals(caplog, "instance_deleted")) >= 2
        return True if done and refusals(caplog, "instance_build_result") else None

    await eventually(both_refused)
    async with db_pool.acquire() as conn:
        after = await instances.get(conn, theirs)
    assert after == before
    record = refusals(caplog, "instance_deleted")[0]
    assert record.sender == user_for(own_agent.registration.service_uuid)  # type: ignore[attr-defined]
    assert f"instance {theirs} is not on its host" in record.getMessage()


async def test_calls_about_what_is_not_its_own_are_refused(
    conductor: ConductorAPI,
    own_agent: Agent,
    db_pool: asyncpg.Pool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    other = await register(conductor, "guard-c")
    own = own_agent.conductor
    ctx = RequestContext.internal()
    caplog.set_level(logging.WARNING)
    with pytest.raises(CallerRefused, match=f"service {other.service_uuid} is not its own"):
        await own.service_heartbeat(ctx, service_uuid=other.service_uuid, version=SERVICE_VERSION)
    with pytest.raises(CallerRefused, match="is not one of its own"):
        await own.report_guests(ctx, compute_node_uuid=other.node_uuid, guests=[])
    with pytest.raises(CallerRefused, match="is not one of its own"):
        await own.check_build(ctx, instance_uuid=uuid.uuid4(), compute_node_uuid=other.node_uuid)
    with pytest.raises(CallerRefused, match="not to host 'guard-c'"):
        await own.register_compute(
            ctx,
            host="guard-c",
            node_uuid=other.node_uuid,
            version=SERVICE_VERSION,
            resources=resources("guard-c.node"),
        )
    with pytest.raises(CallerRefused, match="not to host 'guard-c'"):
        await own.resolve_compute(
            ctx,
            host="guard-c",
            node_uuid=None,
            hypervisor_hostname="guard-c.node",
            identity_file="compute_id",
        )
    assert {r.rpc_method for r in caplog.records if getattr(r, "decision", "") == REFUSED} >= {  # type: ignore[attr-defined]
        "service_heartbeat",
        "report_guests",
        "check_build",
        "register_compute",
        "resolve_compute",
    }
    # Its own node is answered.
    report = await own.report_guests(
        ctx, compute_node_uuid=own_agent.registration.node_uuid, guests=[]
    )
    assert report is not None
    assert report.verdicts == []


async def test_moves_of_other_hosts_and_control_plane_requests_are_refused(
    conductor: ConductorAPI,
    own_agent: Agent,
    db_pool: asyncpg.Pool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = await register(conductor, "guard-d")
    c = await register(conductor, "guard-e")
    instance_uuid = await create_instance(db_pool)
    async with db_pool.acquire() as conn:
        migration_uuid: UUID = await conn.fetchval(
            """INSERT INTO migrations (uuid, instance_uuid, migration_type, status,
                                       source_compute_id, dest_compute_id)
               VALUES ($1, $2, 'evacuation', 'done', $3, $4) RETURNING uuid""",
            uuid.uuid4(),
            instance_uuid,
            b.node_id,
            c.node_id,
        )
    own = own_agent.conductor
    ctx = RequestContext.internal()
    caplog.set_level(logging.WARNING)
    with pytest.raises(CallerRefused, match="does not involve its nodes"):
        await own.evacuation_confirmed(
            ctx, migration_uuid=migration_uuid, compute_node_uuid=own_agent.registration.node_uuid
        )
    with pytest.raises(CallerRefused, match="is not one of its own"):
        await own.copy_removed(ctx, migration_uuid=migration_uuid, compute_node_uuid=b.node_uuid)
    with pytest.raises(CallerRefused, match="does not involve its nodes"):
        await own.check_move(ctx, migration_uuid, own_agent.registration.node_uuid)
    await own.move_result(ctx, migration_uuid, success=False, message="forged")
    await own.evacuate_instance(ctx, migration_uuid)
    await own.build_instances(ctx, instance_uuid)

    async def all_refused() -> bool | None:
        seen = {r.rpc_method for r in caplog.records if getattr(r, "decision", "") == REFUSED}  # type: ignore[attr-defined]
        return True if {"move_result", "evacuate_instance", "build_instances"} <= seen else None

    await eventually(all_refused)
    async with db_pool.acquire() as conn:
        still = await moves.get(conn, migration_uuid)
        unbuilt = await instances.get(conn, instance_uuid)
    assert still.status == "done"
    assert unbuilt.vm_state == "building"
    assert unbuilt.compute_id is None
