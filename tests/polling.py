"""Waiting for something to become true, bounded: how tests wait instead of sleeping."""

from __future__ import annotations

from devkit.readiness import wait_until

__all__ = ["wait_until"]
