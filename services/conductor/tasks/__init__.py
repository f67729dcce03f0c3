"""Conductor workflows, one per module, each an ``execute`` with a matching ``rollback``.

A task runs :meth:`TaskBase.execute`; if that raises, :meth:`TaskBase.rollback` undoes
what was done so far (releases claims, records the fault) before :meth:`TaskBase.run`
returns. Expected errors (:class:`~shared.exceptions.KeelError`: no valid host, an
unreachable host…) end there, fully handled and logged by the rollback; anything else
is raised again after the rollback so the RPC server logs its traceback.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from shared.exceptions import KeelError

LOG = logging.getLogger(__name__)


class TaskBase(ABC):
    #: Shown in logs, e.g. ``build``.
    name: str = "task"

    async def run(self) -> None:
        try:
            await self.execute()
        except Exception as exc:
            try:
                await self.rollback(exc)
            except Exception:
                LOG.exception("rolling back the %s task failed", self.name)
            if not isinstance(exc, KeelError):
                raise

    @abstractmethod
    async def execute(self) -> None:
        """Do the work; raise to have :meth:`rollback` undo it."""

    @abstractmethod
    async def rollback(self, exc: Exception) -> None:
        """Undo what :meth:`execute` did before it raised ``exc``; must be idempotent."""
