"""``lock`` and ``unlock`` (os-lock-server), and what a lock refuses.

A server's owner (its project's users) or an admin may lock it; from 2.73 with a
``locked_reason`` (1-255 characters) that servers show. It records who locked it: the
owner, or an admin of another project. While it is locked, its project's users cannot
act on it — every action but unlocking and reading its console, deleting it, changing
its metadata — and are answered 409 ``Instance ... is locked``; admins still can. An
owner cannot unlock a server an admin locked (403). Locking a locked server (or
unlocking an unlocked one) changes nothing and answers 202 again, as in Nova.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from services.api.http.faults import BadRequest, ConflictingRequest, Forbidden, ItemNotFound
from services.api.http.microversion import APIVersion
from shared.context import RequestContext
from shared.db import instances
from shared.objects.instance import Instance

LOCK = "lock"
UNLOCK = "unlock"
#: Actions a locked server still takes from its owner.
UNLOCKED_ACTIONS = frozenset({LOCK, UNLOCK, "os-getConsoleOutput"})


def check_unlocked(ctx: RequestContext, instance: Instance) -> None:
    """409 for a non-admin acting on a locked server."""
    if instance.locked_by is not None and not ctx.is_admin:
        raise ConflictingRequest(f"Instance {instance.uuid} is locked")


def _reason(value: Any, version: APIVersion) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute lock: it must be null or an object.")
    allowed = {"locked_reason"} if version.at_least("2.73") else set()
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise BadRequest(
            "Invalid input for field/attribute lock. Additional properties are not allowed "
            f"({unknown[0]!r} was unexpected)."
        )
    reason = value.get("locked_reason")
    if reason is not None and (not isinstance(reason, str) or not 1 <= len(reason) <= 255):
        raise BadRequest(
            "Invalid input for field/attribute locked_reason: 1 to 255 characters, or null."
        )
    return reason


async def _set(pool: asyncpg.Pool, instance: Instance, by: str | None, reason: str | None) -> None:
    async with pool.acquire() as conn:
        if not await instances.set_lock(conn, instance.uuid, by, reason):
            raise ItemNotFound(f"Instance {instance.uuid} could not be found.")


async def lock(
    pool: asyncpg.Pool, *, ctx: RequestContext, instance: Instance, value: Any, version: APIVersion
) -> None:
    reason = _reason(value, version)
    if instance.locked_by is not None:
        return
    by = "owner" if instance.project_id == ctx.project_id else "admin"
    await _set(pool, instance, by, reason)


async def unlock(
    pool: asyncpg.Pool, *, ctx: RequestContext, instance: Instance, value: Any
) -> None:
    if value is not None and value != {}:
        raise BadRequest("Invalid input for field/attribute unlock: it must be null or {}.")
    if instance.locked_by == "admin" and not ctx.is_admin:
        raise Forbidden(
            f"Instance {instance.uuid} was locked by an admin: only an admin may unlock it."
        )
    if instance.locked_by is not None:
        await _set(pool, instance, None, None)
