"""How a host task moves one server: which move, how it is cast, and how it ends.

A :class:`Mover` is one kind of move as a host task sees it: the move workflow's kind
(:class:`~shared.objects.migration.MoveKind`), the conductor cast that carries it out,
and which record statuses mean the server arrived, awaits the task's confirm, or stayed
where it was.

* **evacuate** moves every server by evacuation (:data:`EVACUATE`);
* **drain** moves each server by the first mover of :func:`drain_movers` the task
  allows. Today that is cold migration alone, allowed by ``cold_fallback``; live
  migration, once it exists, goes first in that list (a mover whose record ends with
  nothing to confirm), and cold migration stays the fallback the operator allows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.objects.host_task import HostTask, TaskKind
from shared.objects.migration import EVACUATION, MIGRATION, MigrationStatus, MoveKind

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

#: Every mover by the record type its moves write (how an item's move is followed).
BY_TYPE = {mover.kind.migration_type.value: mover for mover in (EVACUATE, COLD)}


def drain_movers(task: HostTask) -> tuple[Mover, ...]:
    """The movers a drain may use, in the order it tries them."""
    # Live migration goes first here once keel has it.
    return (COLD,) if task.cold_fallback else ()


def mover_for(task: HostTask) -> Mover | None:
    """How the task moves its next server; ``None``: it may not move any."""
    if task.kind == TaskKind.EVACUATE:
        return EVACUATE
    movers = drain_movers(task)
    return movers[0] if movers else None
