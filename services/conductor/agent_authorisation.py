"""What a compute agent may ask the conductor, checked against its broker user.

An agent connecting as its own broker user (``keel-compute-<service uuid>``, see
:mod:`shared.rpc.agent_users`) is known for certain: RabbitMQ checks every message's
``user_id`` against the connection. Such an agent may ask the conductor only about what is
its own, and only what agents ask:

* registering or resolving the host its credentials were issued for (or, once it has
  registered, its service's host: an operator rename keeps the credentials valid);
* heartbeats of its own service;
* results and questions about instances on its own nodes (or moving to or from them);
* moves whose source or destination is one of its nodes, and reports about its nodes.

Anything else is refused with :class:`~shared.exceptions.CallerRefused` and logged (the
decision ``rpc_refused``), before the method runs. Requests from any other broker user —
the control plane's, or agents sharing one user where per-agent users are not set up —
are not checked here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from uuid import UUID

import asyncpg
from pydantic import BaseModel

from services.conductor.rpcapi import (
    CheckBuild,
    CheckMove,
    CopyRemoved,
    EvacuationConfirmed,
    InstanceActionResult,
    InstanceBuildResult,
    InstanceDeleted,
    MoveResult,
    RegisterCompute,
    ReportGuests,
    ResolveCompute,
    ServiceHeartbeat,
    TakeRequest,
)
from shared.db import agent_users as issued
from shared.db.placement import node_id_sql
from shared.rpc.agent_users import refuse, service_of

#: Why a request is refused, or ``None`` to let it through.
Check = Callable[["AgentGuard", UUID, BaseModel], Awaitable[str | None]]


class AgentGuard:
    """The conductor's RPC server guard (see :mod:`shared.rpc.server`)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def __call__(self, sender: str | None, method: str, request: BaseModel) -> None:
        service_uuid = service_of(sender)
        if service_uuid is None:
            return
        assert sender is not None
        check = _CHECKS.get(method)
        if check is None:
            raise refuse(sender, method, "compute agents may not send this request")
        why = await check(self, service_uuid, request)
        if why is not None:
            raise refuse(sender, method, why)

    async def host(self, service_uuid: UUID, host: str) -> str | None:
        """Why an agent of ``service_uuid`` may not start as ``host``, if it may not."""
        async with self.pool.acquire() as conn:
            service = await conn.fetchrow(
                """SELECT host, deleted_at FROM services
                    WHERE uuid = $1 AND "binary" = 'keel-compute'""",
                service_uuid,
            )
            if service is not None:
                if service["deleted_at"] is not None:
                    return (
                        f"compute service {service_uuid} (host {service['host']!r}) was "
                        "deleted; make new credentials for this host (keel-manage agent "
                        "credentials HOST)"
                    )
                if service["host"] != host:
                    return (
                        f"these credentials belong to compute service {service_uuid} of host "
                        f"{service['host']!r}, not to host {host!r}. Nothing was changed. If "
                        f"this is that host (renamed by an operator), set KEEL_HOST="
                        f"{service['host']}; otherwise make credentials for {host!r} "
                        "(keel-manage agent credentials HOST)"
                    )
                return None
            issued_for = await issued.host_of(conn, service_uuid)
            if issued_for is None:
                return (
                    f"no credentials were issued for service {service_uuid} in this "
                    "deployment's database"
                )
            if issued_for != host:
                return f"these credentials were issued for host {issued_for!r}, not {host!r}"
            other = await conn.fetchval(
                """SELECT uuid FROM services
                    WHERE host = $1 AND "binary" = 'keel-compute' AND deleted_at IS NULL""",
                host,
            )
        if other is not None:
            return (
                f"host {host!r} registered as compute service {other} after these "
                "credentials were made; make new ones (keel-manage agent credentials HOST)"
            )
        return None

    async def owns_nodes(self, service_uuid: UUID, *node_uuids: UUID) -> str | None:
        async with self.pool.acquire() as conn:
            owned = await conn.fetchval(
                """SELECT count(*) FROM compute_nodes n JOIN services s ON s.id = n.service_id
                    WHERE s.uuid = $1 AND n.uuid = ANY($2::uuid[])""",
                service_uuid,
                list(set(node_uuids)),
            )
        if owned != len(set(node_uuids)):
            return f"compute node {', '.join(map(str, node_uuids))} is not one of its own"
        return None

    async def owns_instance(self, service_uuid: UUID, instance_uuid: UUID) -> str | None:
        """Whether the instance is on one of the service's nodes, or moving to or from one."""
        async with self.pool.acquire() as conn:
            owned = await conn.fetchval(
                f"""SELECT EXISTS (
                          SELECT 1 FROM instances i
                            JOIN compute_nodes n ON n.id = {node_id_sql("i")}
                            JOIN services s ON s.id = n.service_id
                           WHERE i.uuid = $1 AND s.uuid = $2)
                       OR EXISTS (
                          SELECT 1 FROM migrations m
                            JOIN compute_nodes n
                              ON n.id IN (m.source_compute_id, m.dest_compute_id)
                            JOIN services s ON s.id = n.service_id
                           WHERE m.instance_uuid = $1 AND s.uuid = $2
                             AND m.deleted_at IS NULL)""",
                instance_uuid,
                service_uuid,
            )
        return None if owned else f"instance {instance_uuid} is not on its host"

    async def owns_move(
        self, service_uuid: UUID, migration_uuid: UUID, node_uuid: UUID | None = None
    ) -> str | None:
        """Whether one of the service's nodes (``node_uuid``, if given) ends the move."""
        async with self.pool.acquire() as conn:
            owned = await conn.fetchval(
                """SELECT EXISTS (
                          SELECT 1 FROM migrations m
                            JOIN compute_nodes n
                              ON n.id IN (m.source_compute_id, m.dest_compute_id)
                            JOIN services s ON s.id = n.service_id
                           WHERE m.uuid = $1 AND s.uuid = $2
                             AND ($3::uuid IS NULL OR n.uuid = $3))""",
                migration_uuid,
                service_uuid,
                node_uuid,
            )
        return None if owned else f"migration {migration_uuid} does not involve its nodes"


async def _resolve(guard: AgentGuard, service: UUID, req: BaseModel) -> str | None:
    assert isinstance(req, ResolveCompute | RegisterCompute)
    return await guard.host(service, req.host)


async def _heartbeat(guard: AgentGuard, service: UUID, req: BaseModel) -> str | None:
    assert isinstance(req, ServiceHeartbeat)
    if req.service_uuid != service:
        return f"service {req.service_uuid} is not its own"
    return None


async def _instance(guard: AgentGuard, service: UUID, req: BaseModel) -> str | None:
    assert isinstance(
        req, InstanceBuildResult | InstanceActionResult | InstanceDeleted | TakeRequest
    )
    return await guard.owns_instance(service, req.instance_uuid)


async def _node(guard: AgentGuard, service: UUID, req: BaseModel) -> str | None:
    assert isinstance(req, CheckBuild | ReportGuests)
    return await guard.owns_nodes(service, req.compute_node_uuid)


async def _move(guard: AgentGuard, service: UUID, req: BaseModel) -> str | None:
    assert isinstance(req, MoveResult)
    return await guard.owns_move(service, req.migration_uuid)


async def _move_at_node(guard: AgentGuard, service: UUID, req: BaseModel) -> str | None:
    assert isinstance(req, EvacuationConfirmed | CopyRemoved | CheckMove)
    return await guard.owns_nodes(service, req.compute_node_uuid) or await guard.owns_move(
        service, req.migration_uuid, req.compute_node_uuid
    )


#: What an agent may send, and how each request is checked; anything else is refused.
_CHECKS: dict[str, Check] = {
    "resolve_compute": _resolve,
    "register_compute": _resolve,
    "service_heartbeat": _heartbeat,
    "instance_build_result": _instance,
    "instance_action_result": _instance,
    "instance_deleted": _instance,
    "take_request": _instance,
    "check_build": _node,
    "check_move": _move_at_node,
    "report_guests": _node,
    "move_result": _move,
    "evacuation_confirmed": _move_at_node,
    "copy_removed": _move_at_node,
}
