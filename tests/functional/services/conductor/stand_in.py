"""A stand-in compute agent and the API-side steps the conductor tests need."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar
from uuid import UUID

import asyncpg

from services.compute.rpcapi import (
    RPC_VERSION,
    BuildAndRunInstance,
    GuestAction,
    InstanceSpec,
    TerminateInstance,
    topic_for,
)
from services.conductor.rpcapi import ConductorAPI, PowerAction, Registration
from shared.context import RequestContext
from shared.db import instance_actions, instances, request_specs
from shared.objects.compute_node import NodeResources
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec
from shared.objects.states import VmState
from shared.rpc.server import RPCServer
from shared.rpc.transport import Transport
from shared.versions import SERVICE_VERSION

T = TypeVar("T")

SOON = 20.0
SMALL = FlavorSnapshot(flavorid="1", name="small", vcpus=1, memory_mb=512, root_gb=1)


class StandInCompute:
    """Serves ``compute.<service uuid>``: records what it is asked to build and reports back."""

    def __init__(self, conductor: ConductorAPI, *, fail_with: str | None = None) -> None:
        self.conductor = conductor
        self.fail_with = fail_with
        #: When False, builds are recorded but not reported (the test reports them).
        self.report = True
        self.built: list[InstanceSpec] = []

    async def build_and_run_instance(self, ctx: RequestContext, req: BuildAndRunInstance) -> None:
        self.built.append(req.instance)
        if self.report:
            await self.conductor.instance_build_result(
                ctx,
                req.instance.uuid,
                success=self.fail_with is None,
                message=self.fail_with or "",
            )

    async def terminate_instance(self, ctx: RequestContext, req: TerminateInstance) -> None:
        await self.conductor.instance_deleted(ctx, req.instance_uuid)

    async def soft_delete_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        await self.conductor.instance_action_result(
            ctx, req.instance_uuid, PowerAction.SOFT_DELETE, success=True
        )

    async def restore_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        await self.conductor.instance_action_result(
            ctx, req.instance_uuid, PowerAction.RESTORE, success=True
        )


def resources(hostname: str, *, memory_mb: int = 2048) -> NodeResources:
    return NodeResources(
        hypervisor_hostname=hostname,
        vcpus=4,
        memory_mb=memory_mb,
        local_gb=50,
        cpu_allocation_ratio=1.0,
        ram_allocation_ratio=1.0,
        disk_allocation_ratio=1.0,
    )


async def register(conductor: ConductorAPI, host: str, *, memory_mb: int = 2048) -> Registration:
    return await conductor.register_compute(
        RequestContext.internal(),
        host=host,
        node_uuid=uuid.uuid4(),
        version=SERVICE_VERSION,
        resources=resources(f"{host}.node", memory_mb=memory_mb),
    )


async def heartbeat(conductor: ConductorAPI, registration: Registration) -> None:
    """Report the host up, as an agent's first heartbeat does once it consumes its queue."""
    await conductor.service_heartbeat(
        RequestContext.internal(), service_uuid=registration.service_uuid, version=SERVICE_VERSION
    )


async def serve_stand_in(
    transport: Transport, registration: Registration, stand_in: StandInCompute
) -> RPCServer:
    """Consume the host's queue with ``stand_in``, then report the host up."""
    server = RPCServer(
        transport, topic_for(registration.service_uuid), stand_in, version=RPC_VERSION
    )
    await server.start(prefetch=4)
    await heartbeat(stand_in.conductor, registration)
    return server


async def create_instance(pool: asyncpg.Pool, flavor: FlavorSnapshot = SMALL) -> UUID:
    """What keel-api does before it casts build_instances."""
    instance_uuid = uuid.uuid4()
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn, conn.transaction():
        await instances.create(
            conn,
            instance_uuid=instance_uuid,
            project_id="p",
            user_id="u",
            display_name="vm",
            flavor=flavor,
            image_ref="image-1",
            availability_zone=None,
        )
        await request_specs.create(
            conn,
            RequestSpec(instance_uuid=instance_uuid, project_id="p", user_id="u", flavor=flavor),
        )
        await instance_actions.start(conn, ctx, instance_uuid, "create")
    return instance_uuid


async def eventually(check: Callable[[], Awaitable[T | None]]) -> T:
    """Poll ``check`` until it returns something, for at most ``SOON`` seconds."""
    async with asyncio.timeout(SOON):
        while True:
            result = await check()
            if result is not None:
                return result
            await asyncio.sleep(0.05)


async def until(predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds, for at most ``SOON`` seconds."""

    async def check() -> bool | None:
        return True if predicate() else None

    await eventually(check)


async def until_active(pool: asyncpg.Pool, instance_uuid: UUID) -> None:
    """Until the instance is ACTIVE (its build reported)."""

    async def active() -> bool | None:
        async with pool.acquire() as conn:
            found = await instances.find(conn, instance_uuid)
        return True if found is not None and found.vm_state == VmState.ACTIVE else None

    await eventually(active)


#: The conductor and the scheduler heartbeat their own service rows all along: only
#: compute services are left alone by what the tests check.
_COMPUTE_ONLY = {"services": """WHERE "binary" = 'keel-compute'"""}


async def dump(pool: asyncpg.Pool, tables: tuple[str, ...]) -> dict[str, list[str]]:
    """Every row of ``tables`` as JSON text (of ``services``, the compute services')."""
    async with pool.acquire() as conn:
        return {
            table: [
                row[0]
                for row in await conn.fetch(
                    f"SELECT to_jsonb(t)::text FROM {table} t {_COMPUTE_ONLY.get(table, '')} "
                    "ORDER BY id"
                )
            ]
            for table in tables
        }
