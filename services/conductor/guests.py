"""What the guests an agent finds on its host are to become (``report_guests``).

Every agent reports its guests at start-up and periodically. The database decides each
one's fate from its instance and the moves (evacuations and cold migrations) from or to
this node:

* its instance was deleted: remove it;
* an evacuation away from here is still under way: keep it, do not start it;
* a cold migration from here was confirmed, or one to here was reverted, and the
  instance lives elsewhere: the copy is redundant, remove it (``moved``);
* the instance lives here: keep it;
* an evacuation away from here is ``done`` or ``completed``: remove the local copy;
* a move of it from or to here has not ended: keep it;
* nothing explains it: never destroyed; recorded as orphaned for an operator.

A guest is never removed because a host name looks different.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg

from services.conductor.rpcapi import GuestFate, GuestsReport, GuestVerdict, ReportGuests
from shared.db import compute_nodes, instances, moves, orphans, placement, services
from shared.db.pool import Connection
from shared.objects.migration import Migration, MigrationStatus, MigrationType

#: The first release whose agents know the ``moved`` fate (conductor RPC 1.5).
MOVED_SINCE_RELEASE = 6

#: Statuses in which an evacuation away from a host has not ended.
_EVACUATING = (MigrationStatus.ACCEPTED, MigrationStatus.PRE_MIGRATING)
#: Statuses in which a move has not ended: its guests stay where they are.
_UNDER_WAY = (
    MigrationStatus.ACCEPTED,
    MigrationStatus.PRE_MIGRATING,
    MigrationStatus.FINISHED,
    MigrationStatus.CONFIRMING,
    MigrationStatus.REVERTING,
)
_LEFT = (MigrationStatus.CONFIRMING, MigrationStatus.CONFIRMED)
_RETURNED = (MigrationStatus.REVERTING, MigrationStatus.REVERTED)


def guest_verdict(
    guest: UUID, instance_node: int | None, deleted: bool, history: list[Migration], node: int
) -> GuestVerdict:
    """What one guest on node ``node`` is to become; ``history``: its moves from or to it."""
    if deleted:
        return GuestVerdict(instance_uuid=guest, fate=GuestFate.DELETED, reason="deleted")
    away = [
        m
        for m in history
        if m.migration_type == MigrationType.EVACUATION and m.source_compute_id == node
    ]
    evacuation = away[-1] if away else None
    if evacuation is not None and evacuation.status in _EVACUATING:
        return GuestVerdict(
            instance_uuid=guest,
            fate=GuestFate.EVACUATING,
            migration_uuid=evacuation.uuid,
            reason=f"evacuation {evacuation.uuid} is {evacuation.status}",
        )
    latest = history[-1] if history else None
    if (
        latest is not None
        and latest.migration_type == MigrationType.MIGRATION
        and instance_node != node
    ):
        if latest.source_compute_id == node and latest.status in _LEFT:
            return GuestVerdict(
                instance_uuid=guest,
                fate=GuestFate.MOVED,
                migration_uuid=latest.uuid,
                reason=f"migration {latest.uuid} to {latest.dest_compute} is {latest.status}",
            )
        if latest.dest_compute_id == node and latest.status in _RETURNED:
            return GuestVerdict(
                instance_uuid=guest,
                fate=GuestFate.MOVED,
                migration_uuid=latest.uuid,
                reason=f"migration {latest.uuid} from {latest.source_compute} is {latest.status}",
            )
    if instance_node == node:
        return GuestVerdict(instance_uuid=guest, fate=GuestFate.KEEP)
    if evacuation is not None and evacuation.status in (
        MigrationStatus.DONE,
        MigrationStatus.COMPLETED,
    ):
        return GuestVerdict(
            instance_uuid=guest,
            fate=GuestFate.EVACUATED,
            migration_uuid=evacuation.uuid,
            reason=f"evacuation {evacuation.uuid} rebuilt it on {evacuation.dest_compute}",
        )
    if latest is not None and latest.status in _UNDER_WAY:
        return GuestVerdict(
            instance_uuid=guest,
            fate=GuestFate.KEEP,
            migration_uuid=latest.uuid,
            reason=f"{latest.migration_type} {latest.uuid} is {latest.status}",
        )
    where = "no instance has this id" if instance_node is None else "placed on another node"
    return GuestVerdict(
        instance_uuid=guest,
        fate=GuestFate.ORPHANED,
        reason=f"{where}, and no move from or to this host explains it",
    )


def step_down(verdict: GuestVerdict, agent_release: int) -> GuestVerdict:
    """What an agent of ``agent_release`` can read: older ones know no ``moved``."""
    if verdict.fate is GuestFate.MOVED and agent_release < MOVED_SINCE_RELEASE:
        return verdict.model_copy(
            update={"fate": GuestFate.KEEP, "reason": f"{verdict.reason} (agent too old to act)"}
        )
    return verdict


async def _moves_of(conn: Connection, node_id: int, instance_uuid: UUID) -> list[Migration]:
    rows = await conn.fetch(
        """SELECT * FROM migrations
            WHERE instance_uuid = $1 AND deleted_at IS NULL
              AND (source_compute_id = $2 OR dest_compute_id = $2)
            ORDER BY id""",
        instance_uuid,
        node_id,
    )
    return [Migration.from_row(row) for row in rows]


async def report_guests(pool: asyncpg.Pool, req: ReportGuests, down_time: float) -> GuestsReport:
    """Classify the agent's guests; record the orphans; list evacuations to confirm."""
    async with pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, req.compute_node_uuid)
        release = MOVED_SINCE_RELEASE
        if node.service_id is not None:
            service = await services.get_by_id(conn, node.service_id, down_time)
            release = service.version
        verdicts = []
        for guest in req.guests:
            instance = await instances.find(conn, guest)
            instance_node = None
            if instance is not None:
                found = await placement.node_of(conn, instance)
                instance_node = None if found is None else found.id
            deleted = instance is not None and instance.deleted_at is not None
            history = await _moves_of(conn, node.id, guest)
            verdict = guest_verdict(guest, instance_node, deleted, history, node.id)
            verdicts.append(step_down(verdict, release))
        done = await moves.from_source(
            conn, node.id, MigrationType.EVACUATION, [MigrationStatus.DONE]
        )
        await orphans.report(
            conn,
            node.id,
            [(v.instance_uuid, v.reason) for v in verdicts if v.fate == GuestFate.ORPHANED],
        )
    to_confirm = [
        GuestVerdict(
            instance_uuid=m.instance_uuid,
            fate=GuestFate.EVACUATED,
            migration_uuid=m.uuid,
            reason=f"evacuation {m.uuid} rebuilt it on {m.dest_compute}",
        )
        for m in done
    ]
    return GuestsReport(verdicts=verdicts, to_confirm=to_confirm)
