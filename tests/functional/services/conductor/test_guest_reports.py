"""A host's guest report judges every guest it lists as if each were reported alone.

On real RabbitMQ and PostgreSQL through a running keel-conductor. The conductor reads the
records of all the listed guests at once (three statements however many there are); the
verdicts must be those of one report per guest, and a report delivered twice at once
records its orphans once.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from services.conductor.rpcapi import ConductorAPI, GuestFate
from shared.context import RequestContext
from shared.db import compute_nodes
from shared.objects.states import PowerState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import create_instance, register, until_active
from tests.functional.services.conductor.test_deadlines import placed_on_a

pytestmark = pytest.mark.functional

CTX = RequestContext()


async def test_a_report_of_many_guests_judges_each_as_if_alone(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    here, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "gr")
    deleted = await create_instance(db_pool)
    await conductor.build_instances(CTX, deleted)
    await until_active(db_pool, deleted)
    elsewhere = await create_instance(db_pool)
    await conductor.build_instances(CTX, elsewhere)
    await until_active(db_pool, elsewhere)
    other = await register(conductor, "gr-b")
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE instances SET deleted_at = now() WHERE uuid = $1", deleted)
        await conn.execute(
            "UPDATE instances SET compute_id = $2 WHERE uuid = $1", elsewhere, other.node_id
        )
        node = await compute_nodes.get_by_id(conn, node_a)
    unknown = uuid.uuid4()
    guests = [here, unknown, deleted, elsewhere]
    power = dict.fromkeys(guests, PowerState.RUNNING)

    alone = []
    for guest in guests:
        report = await conductor.report_guests(CTX, node.uuid, [guest], {guest: power[guest]})
        assert report is not None
        alone += [(v.instance_uuid, v.fate, v.reason) for v in report.verdicts]
    together = await asyncio.gather(
        *(conductor.report_guests(CTX, node.uuid, guests, power) for _ in "ab")
    )

    assert [fate for _, fate, _ in alone] == [
        GuestFate.KEEP,
        GuestFate.ORPHANED,
        GuestFate.DELETED,
        GuestFate.ORPHANED,
    ]
    for report in together:
        assert report is not None
        assert [(v.instance_uuid, v.fate, v.reason) for v in report.verdicts] == alone
    async with db_pool.acquire() as conn:
        orphans = await conn.fetch(
            "SELECT instance_uuid FROM orphaned_guests WHERE compute_node_id = $1", node_a
        )
    assert sorted(r["instance_uuid"] for r in orphans) == sorted([unknown, elsewhere])


async def test_the_power_states_of_many_quiet_servers_follow_one_report(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    first, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "gp")
    servers = [first]
    for _ in range(3):
        server = await create_instance(db_pool)
        await conductor.build_instances(CTX, server)
        await until_active(db_pool, server)
        servers.append(server)
    stays, stops, starts, busy = servers
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'stopped', power_state = $2 WHERE uuid = $1",
            starts,
            int(PowerState.SHUTDOWN),
        )
        await conn.execute("UPDATE instances SET task_state = 'powering-off' WHERE uuid = $1", busy)
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = ANY($1)",
            servers,
        )
        node = await compute_nodes.get_by_id(conn, node_a)
    power = {
        stays: PowerState.RUNNING,
        stops: PowerState.SHUTDOWN,
        starts: PowerState.RUNNING,
        busy: PowerState.SHUTDOWN,
    }

    await asyncio.gather(*(conductor.report_guests(CTX, node.uuid, servers, power) for _ in "ab"))

    async with db_pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT uuid, vm_state, power_state FROM instances WHERE uuid = ANY($1)", servers
        )
    states = {r["uuid"]: (r["vm_state"], r["power_state"]) for r in rows}
    assert states == {
        stays: ("active", int(PowerState.RUNNING)),
        stops: ("stopped", int(PowerState.SHUTDOWN)),
        starts: ("active", int(PowerState.RUNNING)),
        busy: ("active", int(PowerState.RUNNING)),  # a task under way: left alone
    }
