"""How a host task moves one server: which move, how it is cast, and how it ends.

A :class:`Mover` is one kind of move as a host task sees it: the move workflow's kind
(:class:`~shared.objects.migration.MoveKind`), the conductor cast that carries it out,
and which record statuses mean the server arrived, awaits the task's confirm, or stayed
where it was.

* **evacuate** moves every server by evacuation (:data:`EVACUATE`);
* **drain** moves each server live (:data:`LIVE`) where it can: an ACTIVE or PAUSED
  server, in a deployment whose conductors and agents all speak live migration. A
  server that cannot move live — stopped, or in a deployment not yet upgraded — or
  whose live migration failed or was aborted moves by cold migration (:data:`COLD`) if
  the task allows it (``cold_fallback``); otherwise it is left on the host, its item
  failed with the reason (:func:`drain_mover`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.objects.host_task import HostTask
from shared.objects.migration import (
    EVACUATION,
    LIVE_MIGRATION,
    MIGRATION,
    MigrationStatus,
    MoveKind,
)

S = MigrationStatus


@dataclass(frozen=True)
class Mover:
    #: What an operator reads ("cold migration").
    name: str
    kind: MoveKind
    #: The conductor RPC method that carries the recorded move out.
    cast: Callable[[ConductorAPI], Callable[[RequestContext, UUID], Awaitable[None]]]
    #: Record statuses: the server runs elsewhere (the task is done with it).
    arrived: frozenset[str]
    #: The server runs elsewhere once the task confirms the move, as its owner would.
    to_confirm: frozenset[str]
    #: The move ended and the server stayed (or went back).
    stayed: frozenset[str]


EVACUATE = Mover(
    name="evacuation",
    kind=EVACUATION,
    cast=lambda conductor: conductor.evacuate_instance,
    arrived=frozenset({S.DONE, S.COMPLETED}),
    to_confirm=frozenset(),
    stayed=frozenset({S.ERROR, S.FAILED}),
)
COLD = Mover(
    name="cold migration",
    kind=MIGRATION,
    cast=lambda conductor: conductor.migrate_instance,
    arrived=frozenset({S.CONFIRMED}),
    to_confirm=frozenset({S.FINISHED}),
    stayed=frozenset({S.ERROR, S.FAILED, S.REVERTED}),
)

LIVE = Mover(
    name="live migration",
    kind=LIVE_MIGRATION,
    cast=lambda conductor: conductor.live.live_migrate_instance,
    arrived=frozenset({S.COMPLETED}),
    to_confirm=frozenset(),
    # An aborted live migration ends ``cancelled`` with the server where it was; the
    # follower puts every live migration that did not arrive back to pending, and the
    # sweep's start decides what comes next (:func:`drain_mover`).
    stayed=frozenset({S.ERROR, S.FAILED}),
)

#: Every mover by the record type its moves write (how an item's move is followed).
BY_TYPE = {mover.kind.migration_type.value: mover for mover in (EVACUATE, COLD, LIVE)}


@dataclass(frozen=True)
class Choice:
    """How a drain moves one server: a mover, or why it cannot move it."""

    mover: Mover | None
    refused: str | None = None


def drain_mover(
    task: HostTask, vm_state: str, *, live_possible: str | None, live_failed: str | None
) -> Choice:
    """How a drain moves a server in ``vm_state``.

    ``live_possible``: ``None`` when the deployment can migrate live, else why not;
    ``live_failed``: why this server's last live migration by this task did not arrive
    (``None``: it has had none, or it arrived and the server came back).
    """
    why_not_live = live_failed or live_possible
    if why_not_live is None and vm_state not in LIVE.kind.movable:
        why_not_live = (
            f"its vm_state is {vm_state}: a live migration moves only servers in "
            f"{', '.join(s.value for s in LIVE.kind.movable)}"
        )
    if why_not_live is None:
        return Choice(LIVE)
    if not task.cold_fallback:
        return Choice(None, f"{why_not_live}; cold migration was not allowed (cold_fallback)")
    if vm_state not in COLD.kind.movable:
        return Choice(
            None,
            f"{why_not_live}; and its vm_state is {vm_state}: a cold migration moves only "
            f"servers in {', '.join(s.value for s in COLD.kind.movable)}",
        )
    return Choice(COLD)
