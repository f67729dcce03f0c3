"""Queries on ``agent_credentials``: which service UUID a compute agent's broker user names.

See :mod:`shared.rpc.agent_users` for the users themselves.
"""

from __future__ import annotations

import uuid
from uuid import UUID

from shared.db.pool import Connection
from shared.rpc.agent_users import user_for


async def issue(conn: Connection, host: str) -> UUID:
    """The service UUID to make ``host``'s agent credentials for, recorded.

    The host's live compute service if it has one; otherwise a UUID reserved for it (the
    one reserved before, while no service took it), which its first registration takes.
    Call inside a transaction.
    """
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('agent_credentials:' || $1))", host)
    service_uuid: UUID | None = await conn.fetchval(
        """SELECT uuid FROM services
            WHERE host = $1 AND "binary" = 'keel-compute' AND deleted_at IS NULL""",
        host,
    )
    if service_uuid is None:
        service_uuid = await conn.fetchval(
            """SELECT c.service_uuid FROM agent_credentials c
                WHERE c.host = $1
                  AND NOT EXISTS (SELECT 1 FROM services s WHERE s.uuid = c.service_uuid)
                ORDER BY c.created_at DESC LIMIT 1""",
            host,
        )
    if service_uuid is None:
        service_uuid = uuid.uuid4()
    await conn.execute(
        """INSERT INTO agent_credentials (service_uuid, host, broker_user)
           VALUES ($1, $2, $3)
           ON CONFLICT (service_uuid) DO UPDATE SET host = EXCLUDED.host, updated_at = now()""",
        service_uuid,
        host,
        user_for(service_uuid),
    )
    return service_uuid


async def host_of(conn: Connection, service_uuid: UUID) -> str | None:
    """The host credentials for ``service_uuid`` were made for, if any were."""
    host: str | None = await conn.fetchval(
        "SELECT host FROM agent_credentials WHERE service_uuid = $1", service_uuid
    )
    return host
