"""Compute agents' registration and heartbeats: their only path to the database.

An agent presents its node UUID (from its identity file) and its host name. A node
belongs to one host for life: an agent whose node UUID is on record under another host
name is refused with :class:`~shared.exceptions.HostRenameDetected` before anything is
written, so a renamed host cannot quietly take over, or fork, another host's records.
"""

from __future__ import annotations

import logging

import asyncpg

from services.conductor.rpcapi import RegisterCompute, Registration, ServiceHeartbeat
from shared.db import compute_nodes, services
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeNotFound, Conflict, HostRenameDetected, ServiceTooOld
from shared.objects.compute_node import ComputeNode
from shared.objects.service import Binary
from shared.version_checks import refuse_if_older_than_the_rest, refuse_if_unsupported
from shared.version_pins import MinimumVersions

LOG = logging.getLogger(__name__)

#: The topic recorded on compute service rows; each agent consumes ``compute.<uuid>``.
COMPUTE_TOPIC = "compute"


async def _node_or_none(conn: Connection, req: RegisterCompute) -> ComputeNode | None:
    try:
        return await compute_nodes.get_by_uuid(conn, req.node_uuid)
    except ComputeNodeNotFound:
        return None


async def _check_identity(conn: Connection, req: RegisterCompute) -> None:
    """Refuse a node on record under another host, or a host on record with another node."""
    node = await _node_or_none(conn, req)
    if node is not None and node.host != req.host:
        raise HostRenameDetected(
            f"compute node {req.node_uuid} belongs to host {node.host!r}, but this agent says "
            f"its host is {req.host!r}; nothing was changed. If the host was renamed, set "
            f"KEEL_HOST back to {node.host!r}; if this is a different machine, give it its "
            f"own node identity."
        )
    if node is not None:
        return
    nodename = req.resources.hypervisor_hostname
    try:
        other = await compute_nodes.get_by_host_node(conn, req.host, nodename)
    except ComputeNodeNotFound:
        return
    raise Conflict(
        f"host {req.host!r} already has compute node {nodename!r} with UUID {other.uuid}, but "
        f"this agent presents node UUID {req.node_uuid}; nothing was changed. Restore the "
        f"agent's node identity file to {other.uuid}."
    )


class ComputeRegistry:
    """Registers compute agents and records their heartbeats and resource reports."""

    def __init__(
        self, pool: asyncpg.Pool, *, service_down_time: float, minimums: MinimumVersions
    ) -> None:
        self.pool = pool
        self.service_down_time = service_down_time
        self.minimums = minimums

    async def _check_version(self, req: RegisterCompute) -> int | None:
        """Refuse an agent older than every other compute service (its own row aside).

        Returns the version its row had before, if it had one.
        """
        async with self.pool.acquire() as conn:
            own = await services.recorded_version(conn, req.host, Binary.COMPUTE.value)
        counts = await self.minimums.counts(Binary.COMPUTE.value, empty_is_fresh=True)
        try:
            refuse_if_older_than_the_rest(counts, own, req.version)
        except ServiceTooOld as exc:
            LOG.warning(
                "refused compute host %s at version %d: %s",
                req.host,
                req.version,
                exc.message,
                extra={"decision": "service_too_old"},
            )
            raise
        return own

    async def register(self, req: RegisterCompute) -> Registration:
        """Create or refresh the agent's service and node rows, in one transaction."""
        refuse_if_unsupported(req.version)
        previous = await self._check_version(req)
        async with self.pool.acquire() as conn, conn.transaction():
            await _check_identity(conn, req)
            service = await services.get_or_create(
                conn,
                host=req.host,
                binary=Binary.COMPUTE.value,
                topic=COMPUTE_TOPIC,
                version=req.version,
                down_time=self.service_down_time,
            )
            # Not marked up here: the agent's first heartbeat does that, once it consumes
            # its queue.
            node = await compute_nodes.upsert(
                conn,
                node_uuid=req.node_uuid,
                service_id=service.id,
                host=req.host,
                resources=req.resources,
            )
        self.minimums.note(Binary.COMPUTE.value, previous, req.version)
        LOG.info(
            "registered compute host %s: service %s (version %d), node %s (%s)",
            req.host,
            service.uuid,
            req.version,
            node.uuid,
            node.hypervisor_hostname,
            extra={"decision": "compute_registered"},
        )
        return Registration(
            service_uuid=service.uuid, service_id=service.id, node_uuid=node.uuid, node_id=node.id
        )

    async def heartbeat(self, req: ServiceHeartbeat) -> None:
        """Record that the agent is alive; refresh its node's totals if it sent them.

        Only totals are refreshed: usage belongs to the claims in ``allocations``. An
        agent older than this release supports is refused (it exits).
        """
        refuse_if_unsupported(req.version)
        async with self.pool.acquire() as conn, conn.transaction():
            await services.heartbeat(conn, req.service_uuid, req.version)
            if req.resources is None:
                return
            if req.node_uuid is None:
                LOG.warning(
                    "heartbeat of service %s carries resources but no node UUID; ignoring them",
                    req.service_uuid,
                )
                return
            service = await services.get(conn, req.service_uuid, self.service_down_time)
            try:
                node = await compute_nodes.get_by_uuid(conn, req.node_uuid)
            except ComputeNodeNotFound:
                node = None
            if node is not None and node.host != service.host:
                raise HostRenameDetected(
                    f"compute node {req.node_uuid} belongs to host {node.host!r}, but service "
                    f"{service.uuid} is on host {service.host!r}; the report was not recorded."
                )
            await compute_nodes.upsert(
                conn,
                node_uuid=req.node_uuid,
                service_id=service.id,
                host=service.host,
                resources=req.resources,
            )
