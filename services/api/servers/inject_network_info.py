"""``POST /servers/{id}/action {"injectNetworkInfo": null}``: an admin asks that the
guest's network configuration be given to it again.

As Nova's, at every microversion: admins only (403 for anyone else), any value (Nova's
schema takes any, and clients send ``null`` or ``{}``), and the answer is 202 with no
body. In Nova the compute host rewrites the
guest's network data (for the hypervisors that inject it); in keel there is nothing to
rewrite: a server's addresses are fixed when it is created and never change, the
metadata service reads them from the database at every request, and a config drive holds
the same ones. So the action changes nothing and tells no agent; it is recorded, though,
as an ``injectNetworkInfo`` instance action, started and finished at once with a message
saying why nothing was done, and logged. Two at once are two records, both harmless.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from services.api.http.faults import Forbidden
from shared.context import RequestContext
from shared.db import instance_actions
from shared.db.pool import Connection
from shared.db.transaction import in_transaction
from shared.objects.instance import Instance

LOG = logging.getLogger(__name__)

#: The action's name in the request body, and in the server's instance actions.
ACTION = "injectNetworkInfo"
POLICY = "os_compute_api:os-admin-actions:inject_network_info"
NOTHING_TO_DO = (
    "nothing to inject: the server's addresses never change, and the metadata service "
    "serves them from the database"
)


async def inject_network_info(
    pool: asyncpg.Pool, *, ctx: RequestContext, instance: Instance, value: Any
) -> None:
    """Record the request; ``value`` is not looked at (any is accepted, as in Nova)."""
    if not ctx.is_admin:
        raise Forbidden(f"Policy doesn't allow {POLICY} to be performed.")

    async def record(conn: Connection) -> None:
        await instance_actions.start(conn, ctx, instance.uuid, ACTION)
        await instance_actions.finish(conn, instance.uuid, ACTION, NOTHING_TO_DO, error=False)

    await in_transaction(pool, record, what=f"recording injectNetworkInfo of {instance.uuid}")
    LOG.info(
        "injectNetworkInfo for server %s by user %s: %s",
        instance.uuid,
        ctx.user_id,
        NOTHING_TO_DO,
        extra={"decision": "inject_network_info_noop"},
    )
