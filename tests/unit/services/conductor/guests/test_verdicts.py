"""What a guest an agent reports is to become, from its instance and its moves.

One case (at least) per row of the table in :mod:`services.conductor.guests.verdicts`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from services.conductor.guests.verdicts import guest_verdict, step_down
from services.conductor.rpcapi import GuestFate
from shared.objects.migration import Migration, MigrationStatus, MigrationType

HERE, THERE = 1, 2
GUEST = uuid.uuid4()


_ids = iter(range(1, 1_000_000))


def move(kind: MigrationType, status: MigrationStatus, source: int, dest: int) -> Migration:
    return Migration(
        id=next(_ids),
        uuid=uuid.uuid4(),
        instance_uuid=GUEST,
        migration_type=kind,
        status=status,
        source_compute="a",
        source_node="a",
        source_compute_id=source,
        dest_compute="b",
        dest_node="b",
        dest_compute_id=dest,
        dest_host=None,
        user_id=None,
        project_id=None,
        created_at=datetime.now(UTC),
        updated_at=None,
        deleted_at=None,
    )


EVAC, MIGR = MigrationType.EVACUATION, MigrationType.MIGRATION
LIVE = MigrationType.LIVE_MIGRATION
S = MigrationStatus


@pytest.mark.parametrize(
    ("instance_node", "moves", "fate"),
    [
        # No move: here is kept, elsewhere or unknown is an orphan (never destroyed).
        (HERE, [], GuestFate.KEEP),
        (THERE, [], GuestFate.ORPHANED),
        (None, [], GuestFate.ORPHANED),
        # Evacuations away from here.
        (HERE, [(EVAC, S.PRE_MIGRATING, HERE, THERE)], GuestFate.EVACUATING),
        (THERE, [(EVAC, S.DONE, HERE, THERE)], GuestFate.EVACUATED),
        (THERE, [(EVAC, S.COMPLETED, HERE, THERE)], GuestFate.EVACUATED),
        (HERE, [(EVAC, S.FAILED, HERE, THERE)], GuestFate.KEEP),
        # An evacuation being rebuilt here is not an orphan.
        (THERE, [(EVAC, S.PRE_MIGRATING, THERE, HERE)], GuestFate.KEEP),
        # Cold migration away from here: kept until confirmed, removed once confirmed.
        (THERE, [(MIGR, S.FINISHED, HERE, THERE)], GuestFate.KEEP),
        (THERE, [(MIGR, S.CONFIRMING, HERE, THERE)], GuestFate.MOVED),
        (THERE, [(MIGR, S.CONFIRMED, HERE, THERE)], GuestFate.MOVED),
        (THERE, [(MIGR, S.REVERTING, HERE, THERE)], GuestFate.KEEP),
        (HERE, [(MIGR, S.REVERTED, HERE, THERE)], GuestFate.KEEP),
        # Cold migration to here: built while under way, removed once reverted.
        (THERE, [(MIGR, S.PRE_MIGRATING, THERE, HERE)], GuestFate.KEEP),
        (HERE, [(MIGR, S.FINISHED, THERE, HERE)], GuestFate.KEEP),
        (HERE, [(MIGR, S.REVERTING, THERE, HERE)], GuestFate.KEEP),
        (THERE, [(MIGR, S.REVERTING, THERE, HERE)], GuestFate.MOVED),
        (THERE, [(MIGR, S.REVERTED, THERE, HERE)], GuestFate.MOVED),
        (HERE, [(MIGR, S.CONFIRMED, THERE, HERE)], GuestFate.KEEP),
        # A migration that failed leaves the source's copy alone.
        (HERE, [(MIGR, S.FAILED, HERE, THERE)], GuestFate.KEEP),
        # Migrated away and confirmed, then migrated back here: this is the instance.
        (
            HERE,
            [(MIGR, S.CONFIRMED, HERE, THERE), (MIGR, S.CONFIRMED, THERE, HERE)],
            GuestFate.KEEP,
        ),
        # R2d: an evacuation back here is under way, whatever an older evacuation away
        # from here says (finding 1: the new copy must never be destroyed).
        (
            THERE,
            [(EVAC, S.COMPLETED, HERE, THERE), (EVAC, S.PRE_MIGRATING, THERE, HERE)],
            GuestFate.KEEP,
        ),
        (
            THERE,
            [(EVAC, S.DONE, HERE, THERE), (EVAC, S.ACCEPTED, THERE, HERE)],
            GuestFate.KEEP,
        ),
        (
            THERE,
            [(EVAC, S.COMPLETED, HERE, THERE), (MIGR, S.PRE_MIGRATING, THERE, HERE)],
            GuestFate.KEEP,
        ),
        # R3: evacuated away, then evacuated or migrated back: the live copy.
        (
            HERE,
            [(EVAC, S.COMPLETED, HERE, THERE), (EVAC, S.DONE, THERE, HERE)],
            GuestFate.KEEP,
        ),
        (
            HERE,
            [(EVAC, S.DONE, HERE, THERE), (EVAC, S.COMPLETED, THERE, HERE)],
            GuestFate.KEEP,
        ),
        (
            HERE,
            [(EVAC, S.COMPLETED, HERE, THERE), (MIGR, S.CONFIRMED, THERE, HERE)],
            GuestFate.KEEP,
        ),
        # R4: back here and away again: the newest move decides.
        (
            THERE,
            [
                (EVAC, S.COMPLETED, HERE, THERE),
                (MIGR, S.CONFIRMED, THERE, HERE),
                (EVAC, S.DONE, HERE, THERE),
            ],
            GuestFate.EVACUATED,
        ),
        # R4: a move elsewhere under way does not save a copy an older move superseded.
        (
            THERE,
            [(MIGR, S.REVERTED, THERE, HERE), (MIGR, S.PRE_MIGRATING, THERE, 3)],
            GuestFate.MOVED,
        ),
        # R5: a failed, errored or cancelled move's destination copy is never destroyed.
        (THERE, [(EVAC, S.FAILED, THERE, HERE)], GuestFate.ORPHANED),
        (THERE, [(EVAC, S.ERROR, THERE, HERE)], GuestFate.ORPHANED),
        (THERE, [(MIGR, S.FAILED, THERE, HERE)], GuestFate.ORPHANED),
        (THERE, [(MIGR, S.CANCELLED, THERE, HERE)], GuestFate.ORPHANED),
        # R5: a move of the server between two other nodes says nothing about this copy.
        (THERE, [(EVAC, S.DONE, 3, THERE)], GuestFate.ORPHANED),
        # Live migration: both ends keep their copies while it is under way (R2d); the
        # source's copy goes once it completed (R4); a destination's copy a failed or
        # aborted one left is an orphan, never destroyed (R5).
        (HERE, [(LIVE, S.RUNNING, HERE, THERE)], GuestFate.KEEP),
        (HERE, [(LIVE, S.POST_MIGRATING, HERE, THERE)], GuestFate.KEEP),
        (HERE, [(LIVE, S.POST_MIGRATING, THERE, HERE)], GuestFate.KEEP),
        (THERE, [(LIVE, S.COMPLETED, HERE, THERE)], GuestFate.MOVED),
        (HERE, [(LIVE, S.COMPLETED, THERE, HERE)], GuestFate.KEEP),
        (THERE, [(LIVE, S.FAILED, THERE, HERE)], GuestFate.ORPHANED),
        (THERE, [(LIVE, S.CANCELLED, THERE, HERE)], GuestFate.ORPHANED),
    ],
)
def test_guest_verdicts(
    instance_node: int | None,
    moves: list[tuple[MigrationType, MigrationStatus, int, int]],
    fate: GuestFate,
) -> None:
    recorded = [move(*m) for m in moves]
    verdict = guest_verdict(GUEST, instance_node, False, recorded, HERE)
    assert verdict.fate is fate, verdict.reason
    if fate in (GuestFate.MOVED, GuestFate.EVACUATED, GuestFate.EVACUATING):
        deciding = [m for m in recorded if HERE in (m.source_compute_id, m.dest_compute_id)]
        assert verdict.migration_uuid == deciding[-1].uuid


def test_a_deleted_instance_is_removed_whatever_its_moves() -> None:
    moves = [move(MIGR, S.FINISHED, HERE, THERE)]
    assert guest_verdict(GUEST, THERE, True, moves, HERE).fate is GuestFate.DELETED


def test_agents_older_than_cold_migration_are_told_to_keep_instead_of_moved() -> None:
    verdict = guest_verdict(GUEST, THERE, False, [move(MIGR, S.CONFIRMED, HERE, THERE)], HERE)
    assert step_down(verdict, 5).fate is GuestFate.KEEP
    assert step_down(verdict, 6).fate is GuestFate.MOVED


def test_finding_1_the_copy_rebuilt_back_here_is_kept() -> None:
    """Evacuated A→B (completed), then B→A under way: A's report keeps the new copy."""
    history = [move(EVAC, S.COMPLETED, HERE, THERE), move(EVAC, S.PRE_MIGRATING, THERE, HERE)]
    assert guest_verdict(GUEST, THERE, False, history, HERE).fate is GuestFate.KEEP


def test_an_unknown_server_is_an_orphan_whatever_the_records() -> None:
    history = [move(EVAC, S.DONE, HERE, THERE)]
    assert guest_verdict(GUEST, None, False, history, HERE).fate is GuestFate.ORPHANED


@pytest.mark.parametrize(
    "history",
    [
        [(EVAC, S.DONE, HERE, THERE)],
        [(EVAC, S.COMPLETED, HERE, THERE)],
        [(MIGR, S.CONFIRMED, HERE, THERE)],
    ],
)
def test_a_copy_an_ended_move_superseded_goes_once_its_server_is_offloaded(
    history: list[tuple[MigrationType, MigrationStatus, int, int]],
) -> None:
    """Finding 42: evacuated (or migrated) away, then shelved and offloaded: the server is
    placed nowhere, its copy its shelved image. The copy the move left here is the
    move's to remove (R4), not an orphan; without the offload it stays one (an unplaced
    server is no evidence that a newer copy exists)."""
    moves = [move(*m) for m in history]
    offloaded = guest_verdict(GUEST, None, False, moves, HERE, offloaded=True)
    assert offloaded.fate in (GuestFate.EVACUATED, GuestFate.MOVED)
    assert guest_verdict(GUEST, None, False, moves, HERE).fate is GuestFate.ORPHANED


def test_an_offloaded_servers_copy_with_no_move_record_is_an_orphan() -> None:
    assert guest_verdict(GUEST, None, False, [], HERE, offloaded=True).fate is GuestFate.ORPHANED


@pytest.mark.parametrize("status", [S.FINISHED, S.CONFIRMING, S.REVERTING, S.CONFIRMED])
def test_a_resize_on_its_own_host_never_condemns_its_one_copy(status: MigrationStatus) -> None:
    resized = move(MigrationType.RESIZE, status, HERE, HERE)
    assert guest_verdict(GUEST, HERE, False, [resized], HERE).fate is GuestFate.KEEP


def test_a_resize_to_another_host_removes_the_source_copy_once_confirming() -> None:
    resized = move(MigrationType.RESIZE, S.CONFIRMING, HERE, THERE)
    assert guest_verdict(GUEST, THERE, False, [resized], HERE).fate is GuestFate.MOVED


@pytest.mark.parametrize(
    ("instance_node", "moves"),
    [
        (THERE, [(EVAC, S.DONE, HERE, THERE)]),  # R4: evacuated away, by the records
        (HERE, [(MIGR, S.CONFIRMING, HERE, THERE)]),  # R2b: a confirmed migration's source
    ],
)
def test_a_copy_carrying_the_current_token_is_never_removed(
    instance_node: int, moves: list[tuple[MigrationType, MigrationStatus, int, int]]
) -> None:
    history = [move(*m) for m in moves]
    verdict = guest_verdict(GUEST, instance_node, False, history, HERE, current=True)
    assert verdict.fate is GuestFate.KEEP
    assert "current copy token" in verdict.reason


def test_a_copy_on_the_servers_node_without_its_token_is_an_orphan() -> None:
    """Finding 2 by tokens: a stale copy is never taken for the server's."""
    verdict = guest_verdict(GUEST, HERE, False, [], HERE, current=False)
    assert verdict.fate is GuestFate.ORPHANED
    assert guest_verdict(GUEST, HERE, False, [], HERE, current=None).fate is GuestFate.KEEP


def test_a_deleted_servers_copy_goes_whatever_its_token() -> None:
    assert guest_verdict(GUEST, HERE, True, [], HERE, current=True).fate is GuestFate.DELETED


@pytest.mark.parametrize("later", [(LIVE, S.ERROR), (LIVE, S.FAILED), (MIGR, S.ERROR)])
def test_the_source_copy_of_an_evacuation_goes_whatever_failed_move_came_here_after(
    later: tuple[MigrationType, MigrationStatus],
) -> None:
    """Finding 56: evacuated away, then a move back here failed. By the records alone the
    failed move is the last word on this node (its copy, if any, an orphan); a guest
    carrying the token the evacuation's source copy carried is that copy, superseded.
    Any other token (the failed move's copy), or none reported, stays an orphan."""
    evacuation = move(EVAC, S.DONE, HERE, THERE).model_copy(update={"source_token": uuid.uuid4()})
    history = [evacuation, move(later[0], later[1], THERE, HERE)]

    def fate(token: uuid.UUID | None) -> tuple[GuestFate, uuid.UUID | None]:
        verdict = guest_verdict(GUEST, THERE, False, history, HERE, current=False, token=token)
        return verdict.fate, verdict.migration_uuid

    assert fate(evacuation.source_token) == (GuestFate.EVACUATED, evacuation.uuid)
    assert fate(uuid.uuid4())[0] is GuestFate.ORPHANED
    assert fate(None)[0] is GuestFate.ORPHANED
    unplaced = guest_verdict(
        GUEST, None, False, history, HERE, current=False, token=evacuation.source_token
    )
    assert unplaced.fate is GuestFate.ORPHANED
