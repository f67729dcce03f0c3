"""Compute agents' registration and heartbeats: their only path to the database.

An agent first asks :meth:`ComputeRegistry.resolve` what the database knows about its
host (read-only), then registers with its node UUID. Registration runs the same checks
again inside its transaction (:mod:`services.conductor.compute_identity`), so a renamed
host, a lost or replaced identity, or a deleted node is refused before anything is
written, whichever release the agent runs.

A node keeps its UUID when its hypervisor host name changes: the new name is recorded
(and copied to the servers on it), and the change is logged.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.conductor import compute_identity
from services.conductor.rpcapi import (
    ComputeResolution,
    RegisterCompute,
    Registration,
    ResolveCompute,
    ServiceHeartbeat,
)
from shared.context import current_sender
from shared.db import compute_nodes, services
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeNotFound, HostRenameDetected, ServiceTooOld
from shared.objects.compute_node import ComputeNode, NodeResources
from shared.objects.service import Binary
from shared.rpc import agent_users
from shared.version_checks import check_against_the_rest, refuse_if_unsupported
from shared.version_pins import MinimumVersions

LOG = logging.getLogger(__name__)

#: The topic recorded on compute service rows; each agent consumes ``compute.<uuid>``.
COMPUTE_TOPIC = "compute"


async def _record_node(
    conn: Connection,
    *,
    node_uuid: UUID,
    service_id: int,
    host: str,
    resources: NodeResources,
    before: ComputeNode | None,
) -> ComputeNode:
    """Upsert the node; log a hypervisor host name change and copy it to its servers."""
    node = await compute_nodes.upsert(
        conn, node_uuid=node_uuid, service_id=service_id, host=host, resources=resources
    )
    if before is not None and before.hypervisor_hostname != node.hypervisor_hostname:
        moved = await conn.execute(
            """UPDATE instances SET node = $2, updated_at = now()
                WHERE compute_id = $1 AND deleted_at IS NULL""",
            node.id,
            node.hypervisor_hostname,
        )
        LOG.warning(
            "hypervisor host name of compute node %s (host %s) changed: %r → %r; the node "
            "keeps its UUID, and its %s server(s) now show the new name",
            node.uuid,
            host,
            before.hypervisor_hostname,
            node.hypervisor_hostname,
            moved.rpartition(" ")[2],
            extra={"decision": "hypervisor_renamed"},
        )
    return node


class ComputeRegistry:
    """Registers compute agents and records their heartbeats and resource reports."""

    def __init__(
        self, pool: asyncpg.Pool, *, service_down_time: float, minimums: MinimumVersions
    ) -> None:
        self.pool = pool
        self.service_down_time = service_down_time
        self.minimums = minimums

    async def _check_version(self, req: RegisterCompute) -> int | None:
        """Refuse an agent older than every other compute service (its own row aside;
        forced-down and deleted rows on neither side).

        Returns the version its row had before, as the minimum-version counts have it.
        """
        try:
            return await check_against_the_rest(
                self.pool,
                self.minimums,
                binary=Binary.COMPUTE.value,
                host=req.host,
                version=req.version,
            )
        except ServiceTooOld as exc:
            LOG.warning(
                "refused compute host %s at version %d: %s",
                req.host,
                req.version,
                exc.message,
                extra={"decision": "service_too_old"},
            )
            raise

    async def resolve(self, req: ResolveCompute) -> ComputeResolution:
        """What the database knows about the agent's host and node; writes nothing."""
        async with self.pool.acquire() as conn:
            resolution = await compute_identity.resolve(conn, req, self.service_down_time)
        LOG.info(
            "resolved compute host %s (node %s): %s, %s",
            req.host,
            req.node_uuid or "none presented",
            resolution.decision,
            resolution.reason,
            extra={"decision": f"identity_{resolution.decision}"},
        )
        return resolution

    async def register(self, req: RegisterCompute) -> Registration:
        """Create or refresh the agent's service and node rows, in one transaction.

        A compare-and-swap against other registrations and renames: the host's service
        row is written (created, or locked) first, so the identity checks that follow see
        whatever a racing agent or ``keel-manage service rename`` committed before, and
        nothing else of that host changes until this transaction ends. Of two agents
        registering one host with different nodes, the second is refused as a duplicate
        node; an agent starting under a name a rename just gave up finds its node on the
        renamed host and is refused as a rename. A refusal rolls everything back.
        """
        refuse_if_unsupported(req.version)
        previous = await self._check_version(req)
        check = ResolveCompute(
            host=req.host,
            node_uuid=req.node_uuid,
            hypervisor_hostname=req.resources.hypervisor_hostname,
            identity_file="the agent's node identity file",
        )
        async with self.pool.acquire() as conn, conn.transaction():
            sender = current_sender.get()
            named = agent_users.service_of(sender)
            service = await services.get_or_create(
                conn,
                host=req.host,
                binary=Binary.COMPUTE.value,
                topic=COMPUTE_TOPIC,
                version=req.version,
                down_time=self.service_down_time,
                new_uuid=named,
                registering=True,
                self_fence_after=req.self_fence_after,
            )
            await compute_identity.resolve(conn, check, self.service_down_time)
            before = await compute_nodes.find_by_uuid(conn, req.node_uuid)
            if named is not None and service.uuid != named:
                # Another agent registered the host between the guard's check and now.
                assert sender is not None
                raise agent_users.refuse(
                    sender,
                    "register_compute",
                    f"host {req.host!r} is compute service {service.uuid}, not {named}",
                )
            # Not marked up here: the agent's first heartbeat does that, once it consumes
            # its queue.
            node = await _record_node(
                conn,
                node_uuid=req.node_uuid,
                service_id=service.id,
                host=req.host,
                resources=req.resources,
                before=before,
            )
        if not service.forced_down:
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

    @staticmethod
    async def _beat(conn: Connection, req: ServiceHeartbeat) -> None:
        await services.heartbeat(
            conn,
            req.service_uuid,
            req.version,
            agent=True,
            self_fence_after=req.self_fence_after,
            fence_lease=req.fence_lease,
        )

    async def heartbeat(self, req: ServiceHeartbeat) -> None:
        """Record that the agent is alive; refresh its node's totals if it sent them.

        Only totals are refreshed: usage belongs to the claims in ``allocations``. An
        agent older than this release supports is refused (it exits).
        """
        refuse_if_unsupported(req.version)
        if req.resources is None:
            # Most heartbeats: the node's totals did not change. One statement.
            async with self.pool.acquire() as conn:
                await self._beat(conn, req)
            return
        async with self.pool.acquire() as conn, conn.transaction():
            await self._beat(conn, req)
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
            if node is not None and node.service_id not in (None, service.id):
                raise HostRenameDetected(
                    f"compute node {req.node_uuid} belongs to another service than "
                    f"{service.uuid} (host {service.host!r}); the report was not recorded."
                )
            await _record_node(
                conn,
                node_uuid=req.node_uuid,
                service_id=service.id,
                host=service.host,
                resources=req.resources,
                before=node,
            )
