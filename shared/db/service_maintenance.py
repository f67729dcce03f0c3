"""Operator changes to a service that is down: renaming a compute host, deleting a service.

Both act only on a service whose process is stopped — its last heartbeat and its agent's
last registration older than the service down time, whatever ``forced_down`` says, since
a forced-down agent may still be running — and each is one transaction holding the
service row locked, so a starting agent's registration waits for it and then sees the
result (and a rename or delete that waited for a registration sees it and is refused).

* :func:`rename_compute` moves a compute service, its nodes and its servers to a new host
  name. Everything keeps its id and UUID; the agent started with the new host name
  resolves its node identity to the same node and consumes the same queue
  (``compute.<service uuid>``).
* :func:`delete_service` soft-deletes a service and its compute nodes when they host no
  servers and hold no claims. A deleted node's UUID is never used again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shared.db import allocations, compute_nodes, placement, services
from shared.db.pool import Connection
from shared.exceptions import AlreadyExists, Conflict, ServiceNotFound
from shared.objects.instance import Allocation
from shared.objects.service import Binary, Service

LOG = logging.getLogger(__name__)

_LOCKED_COMPUTE = (
    services.SELECT
    + """ WHERE s.host = $2 AND s."binary" = 'keel-compute' AND s.deleted_at IS NULL
          FOR UPDATE OF s"""
)


@dataclass(frozen=True)
class Renamed:
    service: Service
    nodes: int
    instances: int


async def _signs_of_life(conn: Connection, service_id: int) -> tuple[float | None, float | None]:
    """Seconds since the service's last heartbeat, and since its agent last registered."""
    row = await conn.fetchrow(
        """SELECT extract(epoch FROM now() - last_seen_up)::float8 AS heartbeat,
                  extract(epoch FROM now() - registered_at)::float8 AS registered
             FROM services WHERE id = $1""",
        service_id,
    )
    assert row is not None
    return row["heartbeat"], row["registered"]


async def check_stopped(conn: Connection, service: Service, down_time: float, doing: str) -> None:
    """Refuse while the service's process still sends heartbeats, or has just registered
    (an agent is not up until its first guest report is answered, but it runs)."""
    heartbeat, registered = await _signs_of_life(conn, service.id)
    if heartbeat is not None and heartbeat < down_time:
        raise Conflict(
            f"cannot {doing}: {service.binary} on host {service.host!r} (service "
            f"{service.uuid}) is up, its last heartbeat was {heartbeat:.0f}s ago. Stop it first "
            f"and wait until it shows as down (after {down_time:g}s without a heartbeat)."
        )
    if registered is not None and registered < down_time:
        raise Conflict(
            f"cannot {doing}: {service.binary} on host {service.host!r} (service "
            f"{service.uuid}) registered {registered:.0f}s ago and may still be starting. Stop "
            f"it first and wait {down_time:g}s."
        )


async def rename_compute(conn: Connection, old: str, new: str, down_time: float) -> Renamed:
    """Rename compute host ``old`` to ``new`` with its nodes and servers, in one transaction."""
    async with conn.transaction():
        row = await conn.fetchrow(_LOCKED_COMPUTE, down_time, old)
        if row is None:
            raise ServiceNotFound(f"there is no compute service on host {old!r}")
        service = Service.from_row(row)
        taken = await services.find_compute(conn, new, down_time)
        if taken is not None:
            raise AlreadyExists(
                f"host {new!r} already has a compute service ({taken.uuid}); nothing was "
                "renamed. Delete that service first if it is stale."
            )
        stray = await conn.fetchval(
            "SELECT uuid FROM compute_nodes WHERE host = $1 AND deleted_at IS NULL LIMIT 1", new
        )
        if stray is not None:
            raise AlreadyExists(
                f"host {new!r} already has compute node {stray}; nothing was renamed."
            )
        await check_stopped(conn, service, down_time, f"rename host {old!r}")
        await conn.execute(
            "UPDATE services SET host = $2, updated_at = now() WHERE id = $1", service.id, new
        )
        nodes = await conn.execute(
            "UPDATE compute_nodes SET host = $2, updated_at = now() WHERE service_id = $1",
            service.id,
            new,
        )
        # Linked rows by id; rows an older release wrote (no id yet) by their host name.
        moved = await conn.execute(
            """UPDATE instances SET host = $3, updated_at = now()
                WHERE compute_id IN (SELECT id FROM compute_nodes WHERE service_id = $1)
                   OR (compute_id IS NULL AND deleted_at IS NULL AND host = $2)""",
            service.id,
            old,
            new,
        )
        renamed = await services.get(conn, service.uuid, down_time)
    LOG.warning(
        "renamed compute host %r to %r: service %s, %s node(s), %s server row(s)",
        old,
        new,
        service.uuid,
        nodes.rpartition(" ")[2],
        moved.rpartition(" ")[2],
        extra={"decision": "host_renamed"},
    )
    return Renamed(
        service=renamed,
        nodes=int(nodes.rpartition(" ")[2]),
        instances=int(moved.rpartition(" ")[2]),
    )


async def delete_service(conn: Connection, service: Service, down_time: float) -> int:
    """Soft-delete a stopped service and its nodes; return how many nodes went with it.

    Refused (:class:`Conflict`) while the service is up, or while its nodes host servers
    or hold claims.
    """
    async with conn.transaction():
        locked = await conn.fetchrow(
            services.SELECT + " WHERE s.id = $2 AND s.deleted_at IS NULL FOR UPDATE OF s",
            down_time,
            service.id,
        )
        if locked is None:
            raise ServiceNotFound(f"Service {service.uuid} not found.")
        service = Service.from_row(locked)
        await check_stopped(conn, service, down_time, "delete the service")
        nodes = await compute_nodes.of_service(conn, service.id)
        node_ids = [node.id for node in nodes]
        released: list[Allocation] = []
        if service.binary == Binary.COMPUTE:
            await _check_empty(conn, service, node_ids)
            released = await _release_evacuated(conn, node_ids)
        await conn.execute(
            """UPDATE compute_nodes SET deleted_at = now(), updated_at = now()
                WHERE service_id = $1 AND deleted_at IS NULL""",
            service.id,
        )
        await conn.execute(
            "UPDATE services SET deleted_at = now(), updated_at = now() WHERE id = $1",
            service.id,
        )
    LOG.warning(
        "deleted %s service %s on host %r with %d compute node(s): %s%s",
        service.binary,
        service.uuid,
        service.host,
        len(nodes),
        ", ".join(str(node.uuid) for node in nodes) or "none",
        f"; released the claims of {len(released)} server(s) evacuated from it" if released else "",
        extra={"decision": "service_deleted"},
    )
    return len(nodes)


#: Claims on a node that only the copies of servers evacuated away from it explain: the
#: evacuation is ``done`` (rebuilt elsewhere) and the host never confirmed it removed its
#: copy. A host deleted for good never will; its claims go with it.
_EVACUATED_CLAIM = """
    a.compute_node_id = ANY($1::bigint[]) AND a.consumer_uuid = a.instance_uuid
    AND EXISTS (SELECT 1 FROM migrations m
                 WHERE m.instance_uuid = a.instance_uuid
                   AND m.source_compute_id = a.compute_node_id
                   AND m.migration_type = 'evacuation' AND m.status = 'done'
                   AND m.deleted_at IS NULL)"""


async def _release_evacuated(conn: Connection, node_ids: list[int]) -> list[Allocation]:
    """Release the claims of servers evacuated away from these nodes (their records stay
    ``done``: the copies on the deleted host are gone with it)."""
    rows = await conn.fetch(
        f"SELECT a.consumer_uuid, a.compute_node_id FROM allocations a WHERE {_EVACUATED_CLAIM}",
        node_ids,
    )
    released = []
    for row in rows:
        found = await allocations.release(conn, row["consumer_uuid"], row["compute_node_id"])
        if found is not None:
            released.append(found)
    return released


async def _check_empty(conn: Connection, service: Service, node_ids: list[int]) -> None:
    servers = await placement.count_on(conn, node_ids)
    if servers:
        raise Conflict(
            f"Unable to delete compute service that is hosting instances: host "
            f"{service.host!r} has {servers} server(s). Delete them (or move them) first."
        )
    claims: int = await conn.fetchval(
        f"""SELECT count(*) FROM allocations a
             WHERE a.compute_node_id = ANY($1::bigint[]) AND NOT ({_EVACUATED_CLAIM})""",
        node_ids,
    )
    if claims:
        raise Conflict(
            f"Unable to delete compute service on host {service.host!r}: its node(s) hold "
            f"{claims} resource claim(s) of servers being built or deleted. Try again once "
            "they are finished."
        )
