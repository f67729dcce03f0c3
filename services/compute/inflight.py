"""Operations on guests that are in progress, one at a time per guest.

Casts arrive at least once and in any order, so a build may be redelivered while it is
still running, or a terminate may arrive in the middle of the build it undoes. The
manager holds a guest's slot for the whole operation: the second one waits for the first
and then sees what it left. The slots in use are what a stopping agent is still draining.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from uuid import UUID


@dataclass
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    running: str | None = None


class InFlight:
    def __init__(self) -> None:
        self._slots: dict[UUID, _Slot] = {}

    @asynccontextmanager
    async def hold(self, instance_uuid: UUID, operation: str) -> AsyncIterator[None]:
        """Run ``operation`` on the guest once no other operation on it is running."""
        slot = self._slots.setdefault(instance_uuid, _Slot())
        slot.users += 1
        try:
            async with slot.lock:
                slot.running = operation
                try:
                    yield
                finally:
                    slot.running = None
        finally:
            slot.users -= 1
            if slot.users == 0:
                del self._slots[instance_uuid]

    def operations(self) -> dict[UUID, str]:
        """Guest → operation running on it now."""
        return {
            instance_uuid: slot.running
            for instance_uuid, slot in self._slots.items()
            if slot.running is not None
        }

    def __len__(self) -> int:
        return sum(slot.users for slot in self._slots.values())
