"""Scheduler weighers, one per module; :func:`default_weighers` is the set keel runs."""

from __future__ import annotations

from services.scheduler.weighers.base import HostWeigher
from services.scheduler.weighers.ram import RamWeigher

__all__ = ["HostWeigher", "RamWeigher", "default_weighers"]


def default_weighers() -> list[HostWeigher]:
    return [RamWeigher()]
