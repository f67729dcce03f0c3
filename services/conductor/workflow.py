"""Conductor workflows, one per module, each an ``execute`` with a matching ``rollback``.

A task runs :meth:`TaskBase.execute`. What happens when that raises follows the
settlement policy (:mod:`shared.rpc.settlement`):

* a business error (a :class:`~shared.exceptions.KeelError` that is not transient: no
  valid host, an unreachable host…) is the workflow's outcome: :meth:`TaskBase.rollback`
  undoes what was done so far (releases claims, records the fault) and the task ends;
* a transient failure is raised again untouched: the message is tried again, and since
  every step of a task converges, the next attempt carries on where this one stopped;
* anything else is a bug: it is rolled back as a failure and raised again, so the RPC
  server logs its traceback and dead-letters the message.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from shared.exceptions import KeelError
from shared.rpc.settlement import Outcome, classify, describe

LOG = logging.getLogger(__name__)


class TaskBase(ABC):
    #: Shown in logs, e.g. ``build``.
    name: str = "task"

    async def run(self) -> None:
        try:
            await self.execute()
        except Exception as exc:
            outcome = classify(exc)
            if outcome is Outcome.TRANSIENT:
                raise
            error = exc if isinstance(exc, KeelError) else KeelError(describe(exc))
            try:
                await self.rollback(error)
            except Exception:
                LOG.exception("rolling back the %s task failed", self.name)
                raise
            if outcome is Outcome.POISON:
                raise

    @abstractmethod
    async def execute(self) -> None:
        """Do the work; raise to have :meth:`rollback` undo it."""

    @abstractmethod
    async def rollback(self, exc: KeelError) -> None:
        """Undo what :meth:`execute` did before it raised ``exc``; must be idempotent."""
