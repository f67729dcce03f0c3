"""Scheduler weighers, one per module; :func:`default_weighers` is the set keel runs."""

from __future__ import annotations

from services.scheduler.weighers.base import HostWeigher
from services.scheduler.weighers.ram import RamWeigher
from services.scheduler.weighers.server_group import ServerGroupSoftWeigher

__all__ = ["HostWeigher", "RamWeigher", "ServerGroupSoftWeigher", "default_weighers"]


def default_weighers() -> list[HostWeigher]:
    """RamWeigher first: its SQL score orders the candidate query."""
    return [RamWeigher(), ServerGroupSoftWeigher()]
