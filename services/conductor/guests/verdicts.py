"""What the guests an agent finds on its host are to become (``report_guests``).

Every agent reports its guests at start-up and periodically. :func:`guest_verdict`, a
pure function, decides each one's fate from the server's row (deleted or not, the node
it lives on) and its **whole move history** — every evacuation and cold migration of
the server, oldest first, not only those touching this node — by the first row of this
table that applies (N is the reporting node, C the server's current node, M the
server's latest move):

====  ============================================================  ===================
row   when                                                          fate
====  ============================================================  ===================
R1    the server was deleted                                        ``deleted``: remove
R2a   M is under way (not ended) and N is M's source, M an           ``evacuating``: keep,
      evacuation still ``accepted``/``pre-migrating``                do not start
R2b   M is a cold migration ``confirming`` and N is its source       ``moved``: remove,
      (not a resize on its own host: N is then both ends)            then ``copy_removed``
R2c   M is a cold migration ``reverting``, N its destination, and   ``moved``: remove,
      the server already linked back to its source                  then ``copy_removed``
R2d   M is under way and N is its source or its destination          ``keep``
R3    N is C (nothing under way touches N: this is the live copy)    ``keep``
R4    the last ended move touching N says N's copy was superseded:   ``evacuated`` or
      N was the source of an evacuation ``done``/``completed`` or    ``moved``: remove
      of a migration ``confirmed`` or a live migration
      ``completed``, or the destination of a migration ``reverted``
      (the server placed on another node, or shelved and offloaded:
      its copy is then its shelved image)
R5    anything else (an unknown server; a copy a failed, cancelled   ``orphaned``: never
      or timed-out move left; a copy no record explains)             destroyed; stopped,
                                                                     reported
====  ============================================================  ===================

So a copy on the server's current node, or on either end of a move under way, is never
destroyed (R2d, R3), whatever older records say; a copy is destroyed only on positive
evidence that the server's current copy is elsewhere and newer (R1, R2b, R2c, R4).

**Copy tokens** (:mod:`shared.copy_tokens`) settle it first where the agent reports
them (release 18 and later): a guest carrying the server's current copy token is never
removed, whatever a row above says (it is kept, and an evacuation's source copy is kept
shut down); on the server's own node (R3) a guest carrying any other token is not the
server's copy: it is kept, shut down, as an orphan; and a guest R5 would call an orphan
that carries the token an evacuation ``done`` or ``completed`` away from N left behind
(its ``source_token``) is that evacuation's source copy, superseded: ``evacuated``,
whatever failed move touched N after it.
The unit tests (``tests/unit/services/conductor/guests/test_verdicts.py``) have a case per
row.

The report's ``to_confirm`` lists the evacuations away from N that are ``done`` and
whose server's verdict on N is ``evacuated`` (R4): the agent removes its copy, if it
still has one, and confirms each, which completes the record and releases N's claim. An
evacuation ``done`` whose server has meanwhile come back to N is completed here, without
removing anything: N's copy is the live one.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.conductor.rpcapi import GuestFate, GuestsReport, GuestVerdict, ReportGuests
from shared import copy_tokens
from shared.db import compute_nodes, instances, moves, orphans, placement, services
from shared.db.pool import Connection
from shared.objects.instance import Instance
from shared.objects.migration import Migration, MigrationStatus, MigrationType
from shared.objects.states import PowerState, VmState

LOG = logging.getLogger(__name__)

#: The first release whose agents know the ``moved`` fate (conductor RPC 1.5).
MOVED_SINCE_RELEASE = 6

S = MigrationStatus
#: Statuses in which a move has not ended: both its ends keep their copies.
UNDER_WAY = (
    S.ACCEPTED,
    S.PRE_MIGRATING,
    S.FINISHED,
    S.CONFIRMING,
    S.REVERTING,
    S.PREPARING,
    S.RUNNING,
    S.POST_MIGRATING,
)
#: Statuses in which an evacuation has not yet been rebuilt elsewhere.
_EVACUATING = (S.ACCEPTED, S.PRE_MIGRATING)


def _verdict(
    guest: UUID, fate: GuestFate, reason: str, move: Migration | None = None
) -> GuestVerdict:
    return GuestVerdict(
        instance_uuid=guest,
        fate=fate,
        migration_uuid=None if move is None else move.uuid,
        reason=reason,
    )


def _superseded(move: Migration, node: int) -> bool:
    """Whether ``move``, ended, left ``node``'s copy superseded by a newer one (R4)."""
    if move.migration_type == MigrationType.EVACUATION:
        return move.source_compute_id == node and move.status in (S.DONE, S.COMPLETED)
    if move.migration_type == MigrationType.LIVE_MIGRATION:
        return move.source_compute_id == node and move.status == S.COMPLETED
    if move.source_compute_id == node:
        return move.status == S.CONFIRMED
    return move.dest_compute_id == node and move.status == S.REVERTED


def _evacuated_copy(history: list[Migration], node: int, token: UUID | None) -> Migration | None:
    """The ended evacuation away from ``node`` whose source copy carried ``token``: a guest
    there carrying it is that copy, superseded by the evacuation, whatever moves touched
    ``node`` after it (a failed move to ``node`` says nothing of this copy)."""
    if token is None:
        return None
    return next(
        (
            move
            for move in reversed(history)
            if move.migration_type == MigrationType.EVACUATION
            and move.source_compute_id == node
            and move.status in (S.DONE, S.COMPLETED)
            and move.source_token == token
        ),
        None,
    )


def guest_verdict(
    guest: UUID,
    instance_node: int | None,
    deleted: bool,
    history: list[Migration],
    node: int,
    *,
    current: bool | None = None,
    token: UUID | None = None,
    offloaded: bool = False,
) -> GuestVerdict:
    """The fate of guest ``guest`` on node ``node``; see the module's table.

    ``instance_node``: the node the server lives on (``None``: no such server, or not
    placed); ``history``: every move of the server, oldest first; ``current``: whether
    the guest carries the server's current copy token (``None``: not reported);
    ``token``: the copy token the guest carries, if reported; ``offloaded``: the server
    is shelved and offloaded (placed nowhere, its copy its shelved image).
    """
    verdict = _by_history(guest, instance_node, deleted, history, node, offloaded=offloaded)
    evacuated = _evacuated_copy(history, node, token)
    if verdict.fate is GuestFate.ORPHANED and evacuated is not None and instance_node is not None:
        reason = (
            f"it carries the copy token evacuation {evacuated.uuid} left behind (rebuilt on "
            f"{evacuated.dest_compute})"
        )
        verdict = _verdict(guest, GuestFate.EVACUATED, reason, evacuated)
    if current is True and verdict.fate in (GuestFate.MOVED, GuestFate.EVACUATED):
        return _verdict(guest, GuestFate.KEEP, "it carries the server's current copy token")
    if current is False and verdict.fate is GuestFate.KEEP and verdict.migration_uuid is None:
        return _verdict(
            guest,
            GuestFate.ORPHANED,
            "the server lives on this node, but this copy does not carry its current copy "
            "token: it is not the server's copy",
        )
    return verdict


def _by_history(
    guest: UUID,
    instance_node: int | None,
    deleted: bool,
    history: list[Migration],
    node: int,
    *,
    offloaded: bool = False,
) -> GuestVerdict:
    """The table's verdict, from the server's row and its move history alone."""
    if deleted:
        return _verdict(guest, GuestFate.DELETED, "deleted")
    latest = history[-1] if history else None
    if latest is not None and latest.status in UNDER_WAY:
        evacuation = latest.migration_type == MigrationType.EVACUATION
        what = f"{latest.migration_type} {latest.uuid} is {latest.status}"
        if latest.source_compute_id == node:
            if evacuation and latest.status in _EVACUATING:
                return _verdict(guest, GuestFate.EVACUATING, what, latest)
            if not evacuation and latest.status == S.CONFIRMING and not latest.in_place:
                reason = f"{what}: its copy on {latest.dest_compute} is the server now"
                return _verdict(guest, GuestFate.MOVED, reason, latest)
            return _verdict(guest, GuestFate.KEEP, what, latest)
        if latest.dest_compute_id == node:
            if not evacuation and latest.status == S.REVERTING and instance_node != node:
                reason = f"{what}: its copy on {latest.source_compute} is the server again"
                return _verdict(guest, GuestFate.MOVED, reason, latest)
            return _verdict(guest, GuestFate.KEEP, what, latest)
    if instance_node == node:
        return _verdict(guest, GuestFate.KEEP, "the server lives here")
    touching = [m for m in history if node in (m.source_compute_id, m.dest_compute_id)]
    last_here = next((m for m in reversed(touching) if m.status not in UNDER_WAY), None)
    placed_elsewhere = instance_node is not None or offloaded
    if placed_elsewhere and last_here is not None and _superseded(last_here, node):
        if last_here.migration_type == MigrationType.EVACUATION:
            reason = f"evacuation {last_here.uuid} rebuilt it on {last_here.dest_compute}"
            return _verdict(guest, GuestFate.EVACUATED, reason, last_here)
        reason = f"migration {last_here.uuid} ({last_here.status}) left this copy redundant"
        return _verdict(guest, GuestFate.MOVED, reason, last_here)
    if instance_node is None:
        where = "no server has this id, or it was never placed"
    else:
        where = "the server lives on another node"
    return _verdict(guest, GuestFate.ORPHANED, f"{where}, and no move record says this copy may go")


def step_down(verdict: GuestVerdict, agent_release: int) -> GuestVerdict:
    """What an agent of ``agent_release`` can read: older ones know no ``moved``."""
    if verdict.fate is GuestFate.MOVED and agent_release < MOVED_SINCE_RELEASE:
        return verdict.model_copy(
            update={"fate": GuestFate.KEEP, "reason": f"{verdict.reason} (agent too old to act)"}
        )
    return verdict


async def _history(conn: Connection, instance_uuid: UUID) -> list[Migration]:
    rows = await conn.fetch(
        """SELECT * FROM migrations
            WHERE instance_uuid = $1 AND deleted_at IS NULL
            ORDER BY id""",
        instance_uuid,
    )
    return [Migration.from_row(row) for row in rows]


async def _records(
    conn: Connection, guests: list[UUID]
) -> dict[UUID, tuple[Instance | None, int | None, bool, list[Migration]]]:
    """Each guest's server (``None`` if none ever had its id), the live node it is
    placed on, whether it is deleted, and its move history: three statements however
    many guests the host has (none for a host without guests)."""
    if not guests:
        return {}
    rows = await conn.fetch("SELECT * FROM instances WHERE uuid = ANY($1::uuid[])", guests)
    found = {row["uuid"]: Instance.from_row(row) for row in rows}
    linked = [i.compute_id for i in found.values() if i.compute_id is not None]
    live = {
        row["id"]
        for row in await conn.fetch(
            "SELECT id FROM compute_nodes WHERE id = ANY($1::bigint[]) AND deleted_at IS NULL",
            linked,
        )
    }
    histories: dict[UUID, list[Migration]] = {guest: [] for guest in guests}
    for row in await conn.fetch(
        """SELECT * FROM migrations
            WHERE instance_uuid = ANY($1::uuid[]) AND deleted_at IS NULL
            ORDER BY id""",
        guests,
    ):
        histories[row["instance_uuid"]].append(Migration.from_row(row))
    records = {}
    for guest in guests:
        instance = found.get(guest)
        if instance is None:
            node, deleted = None, False
        elif instance.compute_id is None:
            # A server from before nodes were linked: matched by its names.
            node, deleted = await _placed(conn, instance)
        else:
            node = instance.compute_id if instance.compute_id in live else None
            deleted = instance.deleted_at is not None
        records[guest] = (instance, node, deleted, histories[guest])
    return records


def _offloaded(instance: Instance | None) -> bool:
    return instance is not None and instance.vm_state == VmState.SHELVED_OFFLOADED


async def _placed(conn: Connection, instance: Instance | None) -> tuple[int | None, bool]:
    if instance is None:
        return None, False
    found = await placement.node_of(conn, instance)
    return (None if found is None else found.id), instance.deleted_at is not None


async def _settle_evacuations(
    conn: Connection, node_id: int, report: ReportGuests
) -> list[GuestVerdict]:
    """The ``done`` evacuations away from ``node_id`` its agent is to confirm (R4).

    One whose server lives on ``node_id`` again is completed now, removing nothing. An
    agent that reports copy tokens settles the rest by what it has: the evacuation's
    source copy (its token) is confirmed whatever moves came after, and so is one whose
    server has no guest there at all (nothing to remove; the claim goes).
    """
    to_confirm = []
    for done in await moves.from_source(
        conn, node_id, MigrationType.EVACUATION, [MigrationStatus.DONE]
    ):
        instance = await instances.find(conn, done.instance_uuid)
        instance_node, deleted = await _placed(conn, instance)
        history = await _history(conn, done.instance_uuid)
        token = current = None
        if report.tokens is not None and done.instance_uuid in report.tokens:
            token = report.tokens[done.instance_uuid]
            current = copy_tokens.is_current(instance, token)
        verdict = guest_verdict(
            done.instance_uuid,
            instance_node,
            deleted,
            history,
            node_id,
            current=current,
            token=token,
            offloaded=_offloaded(instance),
        )
        absent = report.tokens is not None and done.instance_uuid not in report.guests
        if (
            absent
            and verdict.fate is GuestFate.ORPHANED
            and instance_node is not None
            and instance_node != node_id
        ):
            verdict = _verdict(
                done.instance_uuid, GuestFate.EVACUATED, "its copy here is gone", done
            )
        if verdict.fate in (GuestFate.EVACUATED, GuestFate.DELETED):
            to_confirm.append(
                verdict.model_copy(
                    update={"fate": GuestFate.EVACUATED, "migration_uuid": done.uuid}
                )
            )
        elif instance_node == node_id:
            completed = await moves.swap_status(
                conn, done.uuid, expected=[MigrationStatus.DONE], new=MigrationStatus.COMPLETED
            )
            if completed is not None:
                LOG.info(
                    "evacuation %s is completed without removing anything: server %s lives "
                    "on this host again",
                    done.uuid,
                    done.instance_uuid,
                    extra={
                        "instance_uuid": str(done.instance_uuid),
                        "migration_uuid": str(done.uuid),
                    },
                )
    return to_confirm


async def _evacuated_guests_off(
    conn: Connection, verdicts: list[GuestVerdict], power: dict[UUID, PowerState]
) -> None:
    """The source's agent is back and reports the guest of an evacuation still under way
    shut down — it keeps such a guest off, never starting it (``evacuating``): the
    evacuation waits for the host's fence no longer (its agent renews the lease now)."""
    for verdict in verdicts:
        if verdict.fate is not GuestFate.EVACUATING or verdict.migration_uuid is None:
            continue
        if power.get(verdict.instance_uuid) is not PowerState.SHUTDOWN:
            continue
        released = await conn.fetchval(
            """UPDATE migrations SET source_off_at = now(),
                                     held_until = CASE WHEN held_until IS NULL THEN NULL
                                                       ELSE now() END
                WHERE uuid = $1 AND status = 'pre-migrating' AND source_off_at IS NULL
            RETURNING uuid""",
            verdict.migration_uuid,
        )
        if released is not None:
            LOG.info(
                "the source of evacuation %s reports server %s's guest shut down and keeps "
                "it so: the evacuation no longer waits for its fence",
                verdict.migration_uuid,
                verdict.instance_uuid,
                extra={
                    "instance_uuid": str(verdict.instance_uuid),
                    "migration_uuid": str(verdict.migration_uuid),
                    "decision": "evacuation_source_off",
                },
            )


async def _follow_power(
    conn: Connection, guests: list[UUID], power: dict[UUID, PowerState], quiet_for: float
) -> None:
    """The recorded power state of servers living here follows what their host reports.

    Only for a server with no task whose row has not changed for ``quiet_for`` seconds (a
    report taken before an action's result must not undo it): a stop or start whose task
    was cleared without its result, or a guest that stopped by itself. ACTIVE and
    SHUTOFF follow the guest; other vm states keep theirs.
    """
    followed = [g for g in guests if power.get(g) in (PowerState.RUNNING, PowerState.SHUTDOWN)]
    if not followed:
        return
    # One statement for them all: each row is judged on its own, as it would be alone.
    rows = await conn.fetch(
        """UPDATE instances i
              SET power_state = r.state,
                  vm_state = CASE WHEN r.state = $3 THEN $4 ELSE $5 END,
                  updated_at = now()
             FROM unnest($1::uuid[], $2::int[]) AS r(uuid, state)
            WHERE i.uuid = r.uuid AND i.deleted_at IS NULL AND i.task_state IS NULL
              AND i.vm_state IN ($4, $5)
              AND i.vm_state <> CASE WHEN r.state = $3 THEN $4 ELSE $5 END
              AND i.updated_at < now() - make_interval(secs => $6)
        RETURNING i.uuid, i.vm_state, r.state""",
        followed,
        [int(power[g]) for g in followed],
        int(PowerState.RUNNING),
        VmState.ACTIVE.value,
        VmState.STOPPED.value,
        quiet_for,
    )
    for row in rows:
        LOG.warning(
            "server %s is %s on its host: recorded as %s",
            row["uuid"],
            "running" if row["state"] == PowerState.RUNNING else "shut down",
            row["vm_state"],
            extra={"instance_uuid": str(row["uuid"]), "decision": "power_state_followed"},
        )


async def report_guests(pool: asyncpg.Pool, req: ReportGuests, down_time: float) -> GuestsReport:
    """Classify the agent's guests; record the orphans; list evacuations to confirm."""
    async with pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, req.compute_node_uuid)
        release = MOVED_SINCE_RELEASE
        if node.service_id is not None:
            service = await services.get_by_id(conn, node.service_id, down_time)
            release = service.version
        records = await _records(conn, req.guests)
        verdicts = []
        for guest in req.guests:
            instance, instance_node, deleted, history = records[guest]
            current = token = None
            if req.tokens is not None and guest in req.tokens:
                token = req.tokens[guest]
                current = copy_tokens.is_current(instance, token)
            verdict = guest_verdict(
                guest,
                instance_node,
                deleted,
                history,
                node.id,
                current=current,
                token=token,
                offloaded=_offloaded(instance),
            )
            verdicts.append(step_down(verdict, release))
        kept_here = [
            v.instance_uuid
            for v in verdicts
            if v.fate is GuestFate.KEEP and v.migration_uuid is None
        ]
        await _follow_power(conn, kept_here, req.power, down_time)
        await _evacuated_guests_off(conn, verdicts, req.power)
        to_confirm = await _settle_evacuations(conn, node.id, req)
        await orphans.report(
            conn,
            node.id,
            [(v.instance_uuid, v.reason) for v in verdicts if v.fate == GuestFate.ORPHANED],
        )
    return GuestsReport(verdicts=verdicts, to_confirm=to_confirm)
