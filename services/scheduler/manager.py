"""The scheduler's RPC endpoint: pick a host for an instance and claim its resources there.

``select_destinations`` reads the best few hosts that pass the filters (one indexed query,
whatever the size of the cloud), filters and weighs them in memory, then claims the
flavor on a candidate with one atomic ``UPDATE`` in PostgreSQL: the first one tried is
picked at random among the best ``host_subset_size``. If another scheduler filled that
host in the meantime, the claim fails and the next candidate is tried; two schedulers
can never over-commit a host.

It is also idempotent per consumer: a request is served under a transaction-scoped
advisory lock on its consumer, and a consumer that already holds a claim gets that claim
back instead of a second one. A repeated or concurrent request for the same build —
a redelivered cast, or a conductor that crashed after the claim — therefore ends with
one claim on one host.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.scheduler.host_manager import HostManager, WeighedHost
from services.scheduler.rpcapi import SelectDestinations, Selection
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, server_groups
from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound, NoValidHost
from shared.faults import FaultPoints
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec
from shared.objects.server_group import HARD_POLICIES

LOG = logging.getLogger(__name__)

NOT_ENOUGH_HOSTS = "There are not enough hosts available."


def _selection(host: HostState) -> Selection:
    node = host.node
    return Selection(
        service_uuid=host.service.uuid,
        compute_node_id=node.id,
        compute_node_uuid=node.uuid,
        host=node.host,
        nodename=node.hypervisor_hostname,
    )


def no_valid_host_reason(spec: RequestSpec) -> str:
    """Why no host was found: that hosts are lacking, and, for a member of a server group
    with a hard policy, which instance it was and where the other members are."""
    group = spec.group
    if group is None or group.policy not in HARD_POLICIES:
        return NOT_ENOUGH_HOSTS
    return (
        f"{NOT_ENOUGH_HOSTS} Instance {spec.instance_uuid} cannot be placed within the "
        f"policy of its group: {group.describe()}."
    )


async def lock_consumer(conn: Connection, consumer_uuid: UUID) -> None:
    """Serialise, until the transaction ends, every request for one consumer."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))", str(consumer_uuid)
    )


class SchedulerManager:
    """Served on the ``scheduler`` topic; several may run at once as competing consumers."""

    def __init__(
        self, pool: asyncpg.Pool, host_manager: HostManager, faults: FaultPoints | None = None
    ) -> None:
        self.pool = pool
        self.host_manager = host_manager
        self.faults = faults or FaultPoints()

    async def select_destinations(self, ctx: RequestContext, req: SelectDestinations) -> Selection:
        """Filter, weigh and claim; raises NoValidHost when no host has room, and
        InstanceNotFound when the instance was deleted."""
        spec = req.spec
        async with self.pool.acquire() as conn, conn.transaction():
            await lock_consumer(conn, spec.consumer)
            await self._lock_live_instance(conn, spec)
            selection = await self._claimed_before(conn, spec)
            if selection is None:
                selection = await self._select(conn, spec)
        self.faults.reached("scheduler.select.after_claim")
        return selection

    async def _lock_live_instance(self, conn: Connection, spec: RequestSpec) -> None:
        """Hold the instance's row until the claim is made, so that a delete either ends
        first (nothing is claimed: InstanceNotFound) or waits and then releases the claim
        with the rest. A request may reach the scheduler long after it was sent (its
        caller gone), when its server is deleted and nothing would release a new claim.
        (Instance rows are never removed, only marked deleted; a consumer with no row at
        all is placed as asked.)"""
        deleted = await conn.fetchval(
            "SELECT deleted_at IS NOT NULL FROM instances WHERE uuid = $1 FOR SHARE",
            spec.instance_uuid,
        )
        if deleted:
            LOG.info(
                "instance %s was deleted before it was placed: claiming nothing",
                spec.instance_uuid,
                extra={"instance_uuid": str(spec.instance_uuid), "decision": "no_claim"},
            )
            raise InstanceNotFound(
                f"instance {spec.instance_uuid} was deleted before it was placed"
            )

    async def _claimed_before(self, conn: Connection, spec: RequestSpec) -> Selection | None:
        """The host the consumer already holds a claim on, if any."""
        held = await allocations.for_consumer(conn, spec.consumer)
        if not held:
            return None
        down_time = self.host_manager.service_down_time
        host = await compute_nodes.host_state_by_id(conn, held[0].compute_node_id, down_time)
        LOG.info(
            "instance %s already holds a claim on host %s (node %s): a repeated request; "
            "returning that host",
            spec.instance_uuid,
            host.node.host,
            host.node.hypervisor_hostname,
            extra={"instance_uuid": str(spec.instance_uuid), "decision": "claim_reused"},
        )
        return _selection(host)

    async def _select(self, conn: Connection, spec: RequestSpec) -> Selection:
        group = await server_groups.placement(conn, spec.instance_uuid)
        if group is not None:
            spec = spec.model_copy(update={"group": group})
        tried = 0
        async for candidate in self.host_manager.candidates(conn, spec):
            tried += 1
            if await self._claim(conn, candidate, spec):
                return _selection(candidate.host)
        if tried:
            LOG.info(
                "no host left with room for instance %s: all %d candidates were claimed by "
                "other requests first",
                spec.instance_uuid,
                tried,
                extra={"instance_uuid": str(spec.instance_uuid), "decision": "no_valid_host"},
            )
        raise NoValidHost(no_valid_host_reason(spec))

    async def _claim(self, conn: Connection, candidate: WeighedHost, spec: RequestSpec) -> bool:
        node = candidate.host.node
        extra = {"instance_uuid": str(spec.instance_uuid)}
        if await allocations.claim(
            conn, node.id, spec.consumer, spec.flavor, instance_uuid=spec.instance_uuid
        ):
            LOG.info(
                "chose host %s (node %s, weight %.3f) for instance %s and claimed "
                "%d vCPUs, %d MB RAM, %d GB disk",
                node.host,
                node.hypervisor_hostname,
                candidate.weight,
                spec.instance_uuid,
                spec.flavor.vcpus,
                spec.flavor.memory_mb,
                spec.flavor.disk_gb,
                extra={**extra, "decision": "host_selected"},
            )
            return True
        LOG.info(
            "claim on host %s (node %s) for instance %s failed: it no longer has room; "
            "trying the next host",
            node.host,
            node.hypervisor_hostname,
            spec.instance_uuid,
            extra={**extra, "decision": "claim_lost"},
        )
        return False
