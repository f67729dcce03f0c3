"""What the guest is told travels with the build; its address returns when it is deleted."""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.compute.rpcapi import InstanceSpec
from services.conductor.rpcapi import ConductorAPI
from shared.config import NetworkSettings
from shared.context import RequestContext
from shared.db import fixed_ips, instance_actions, instances, server_fields
from shared.exceptions import InstanceNotFound
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import (
    StandInCompute,
    create_instance,
    eventually,
    register,
    serve_stand_in,
)

pytestmark = pytest.mark.functional

NETWORK = NetworkSettings(cidr="10.9.0.0/24")


async def create_with_address(pool: asyncpg.Pool) -> tuple[UUID, str]:
    instance_uuid = await create_instance(pool)
    async with pool.acquire() as conn:
        await server_fields.record_created(
            conn,
            instance_uuid,
            metadata={"role": "db"},
            description=None,
            tags=[],
            user_data="IyEvYmluL3NoCg==",
        )
        held = await fixed_ips.allocate(conn, NETWORK, instance_uuid)
    return instance_uuid, held.address


async def test_the_agent_gets_the_address_metadata_and_user_data(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    registration = await register(conductor, "host")
    agent = StandInCompute(conductor)
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid, address = await create_with_address(db_pool)

    await conductor.build_instances(RequestContext(), instance_uuid)

    [spec] = await eventually(lambda: _some(agent.built))
    assert [(a.network_name, a.address, a.network_id) for a in spec.addresses] == [
        ("private", address, NETWORK.network_id)
    ]
    assert spec.metadata == {"role": "db"}
    assert spec.user_data == "IyEvYmluL3NoCg=="


async def test_deleting_returns_the_address_once_under_concurrent_twins(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    instance_uuid, address = await create_with_address(db_pool)
    async with db_pool.acquire() as conn:
        await instance_actions.start(conn, RequestContext(), instance_uuid, "delete")
        free_before = (await fixed_ips.usage(conn, NETWORK.network_id)).free

    await asyncio.gather(
        *(conductor.instance_deleted(RequestContext(), instance_uuid) for _ in range(3))
    )

    async def freed() -> int | None:
        async with db_pool.acquire() as conn:
            usage = await fixed_ips.usage(conn, NETWORK.network_id)
            deleted = await conn.fetchval(
                "SELECT deleted_at IS NOT NULL FROM instances WHERE uuid = $1", instance_uuid
            )
        return usage.free if deleted and usage.free > free_before else None

    assert await eventually(freed) == free_before + 1
    async with db_pool.acquire() as conn:
        assert await fixed_ips.for_instance(conn, instance_uuid) == []
        with pytest.raises(InstanceNotFound):
            await instances.get(conn, instance_uuid)
        again = await fixed_ips.allocate(conn, NETWORK, instance_uuid, address=address)
    assert again.address == address


async def _some(items: list[InstanceSpec]) -> list[InstanceSpec] | None:
    return list(items) if items else None
