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
from shared.db import compute_nodes, moves
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


@pytest.mark.parametrize("has", ["source-copy", "no-copy", "other-copy"])
async def test_an_evacuation_done_is_settled_by_the_copy_its_source_reports_after_a_failed_move(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, has: str
) -> None:
    """Finding 56: evacuated from A to B, then a live migration back to A failed. A's
    report settles the evacuation by what A has: the evacuation's source copy (its token)
    goes and is confirmed; no copy at all is confirmed too (nothing to remove, A's claim
    goes); a copy with another token (the failed move's) stays an orphan and the
    evacuation waits."""
    server, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, f"ge-{has}")
    b = await register(conductor, f"ge-{has}-b")
    ctx = RequestContext(user_id="u", project_id="p")
    async with db_pool.acquire() as conn:
        a = await compute_nodes.get_by_id(conn, node_a)
        evacuation = await moves.create(
            conn, ctx, instance_uuid=server, migration_type="evacuation", status="done", source=a
        )
        back = await moves.create(
            conn,
            ctx,
            instance_uuid=server,
            migration_type="live-migration",
            status="error",
            source=await compute_nodes.get_by_id(conn, b.node_id),
        )
        for record in (evacuation, back):
            await conn.execute(
                "UPDATE migrations SET dest_compute_id = $2 WHERE uuid = $1",
                record.uuid,
                b.node_id if record is evacuation else node_a,
            )
        await conn.execute(
            "UPDATE instances SET compute_id = $2, copy_token = $3 WHERE uuid = $1",
            server,
            b.node_id,
            evacuation.uuid,
        )
    assert evacuation.source_token is not None
    carried: dict[str, uuid.UUID | None] = {
        "source-copy": evacuation.source_token,
        "other-copy": back.uuid,
    }
    tokens = {server: carried[has]} if has in carried else {}
    guests = list(tokens)
    power = dict.fromkeys(guests, PowerState.SHUTDOWN)

    reports = await asyncio.gather(
        *(conductor.report_guests(CTX, a.uuid, guests, power, tokens) for _ in "ab")
    )

    for report in reports:
        assert report is not None
        confirm = [(v.instance_uuid, v.migration_uuid) for v in report.to_confirm]
        fates = [v.fate for v in report.verdicts]
        if has == "other-copy":
            assert (confirm, fates) == ([], [GuestFate.ORPHANED])
        else:
            assert confirm == [(server, evacuation.uuid)]
            assert fates == ([GuestFate.EVACUATED] if guests else [])


async def test_an_evacuation_done_is_not_confirmed_over_a_copy_carrying_the_current_token(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """By its records the evacuation's source copy goes; but a guest there carrying the
    server's current copy token is the server's copy, and confirming would remove it:
    kept, and the evacuation not confirmed."""
    server, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "ge-current")
    b = await register(conductor, "ge-current-b")
    ctx = RequestContext(user_id="u", project_id="p")
    async with db_pool.acquire() as conn:
        a = await compute_nodes.get_by_id(conn, node_a)
        evacuation = await moves.create(
            conn, ctx, instance_uuid=server, migration_type="evacuation", status="done", source=a
        )
        await conn.execute(
            "UPDATE migrations SET dest_compute_id = $2 WHERE uuid = $1", evacuation.uuid, b.node_id
        )
        await conn.execute(
            "UPDATE instances SET compute_id = $2, copy_token = $3 WHERE uuid = $1",
            server,
            b.node_id,
            evacuation.uuid,
        )
    tokens: dict[uuid.UUID, uuid.UUID | None] = {server: evacuation.uuid}

    report = await conductor.report_guests(
        CTX, a.uuid, [server], {server: PowerState.SHUTDOWN}, tokens
    )

    assert report is not None
    assert [v.fate for v in report.verdicts] == [GuestFate.KEEP]
    assert report.to_confirm == []
