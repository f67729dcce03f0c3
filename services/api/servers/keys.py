"""What creating a server checks and records beyond the server itself: its key pair and quota.

Both run inside the transaction that inserts the server, so a refused request leaves
nothing behind, and the quota counted cannot change before the server is committed.
"""

from __future__ import annotations

from services.api.http.faults import BadRequest
from services.api.resources.quotas import new_servers
from shared.config import QuotaSettings
from shared.context import RequestContext
from shared.db import key_pairs
from shared.db.pool import Connection
from shared.exceptions import KeyPairNotFound
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Instance
from shared.objects.key_pair import KeyPair


async def find_key(conn: Connection, ctx: RequestContext, key_name: str | None) -> KeyPair | None:
    """The caller's key pair ``key_name``; 400 if they have none by that name."""
    if key_name is None:
        return None
    try:
        return await key_pairs.get(conn, ctx.user_id or "", key_name)
    except KeyPairNotFound:
        raise BadRequest("Invalid key_name provided.") from None


async def check_quota(
    conn: Connection,
    ctx: RequestContext,
    quota: QuotaSettings,
    flavor: FlavorSnapshot,
    metadata_items: int,
    *,
    min_count: int = 1,
    max_count: int = 1,
) -> int:
    """How many servers to create, from ``min_count`` to ``max_count``: as many as the
    project's (and the user's) quota has room for, as Nova does; 403
    (:class:`OverQuota`) if not even ``min_count`` fit. Nothing is created otherwise."""
    return await new_servers(
        conn,
        ctx.project_id or "",
        quota,
        flavor,
        metadata_items,
        user_id=ctx.user_id,
        min_count=min_count,
        max_count=max_count,
    )


async def record_key(conn: Connection, instance: Instance, key: KeyPair | None) -> None:
    if key is not None:
        await key_pairs.record_on_instance(conn, instance.uuid, key)
