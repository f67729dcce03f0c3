"""What the conductor says about an agent's identity before it starts, on real PostgreSQL.

Every refusal leaves services, compute_nodes, instances and allocations exactly as they
were, and names what to do.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from services.conductor.rpcapi import ConductorAPI, Registration
from shared.context import RequestContext
from shared.db import allocations, instances, service_maintenance, services
from shared.exceptions import (
    ComputeNodeDeleted,
    DuplicateComputeNode,
    HostRenameDetected,
    HypervisorInUse,
    IdentityLost,
)
from shared.versions import SERVICE_VERSION, STABLE_IDENTITY_VERSION
from tests.functional.services.conductor import stand_in
from tests.functional.services.conductor.stand_in import SMALL, create_instance, resources

pytestmark = pytest.mark.functional

CTX = RequestContext.internal()
TABLES = ("services", "compute_nodes", "instances", "allocations")


#: The conductor and the scheduler heartbeat their own service rows all along: only
#: compute services are the identity checks' to leave alone.
_ONLY = {"services": """WHERE "binary" = 'keel-compute'"""}


async def dump(pool: asyncpg.Pool) -> dict[str, list[str]]:
    """Every row of the tables these checks must never touch, as JSON text."""
    return await stand_in.dump(pool, TABLES)


async def register(
    conductor: ConductorAPI, host: str, node_uuid: UUID | None = None, hypervisor: str = ""
) -> Registration:
    return await conductor.register_compute(
        CTX,
        host=host,
        node_uuid=node_uuid or uuid.uuid4(),
        version=SERVICE_VERSION,
        resources=resources(hypervisor or host),
    )


async def resolve(
    conductor: ConductorAPI, host: str, node_uuid: UUID | None, hypervisor: str = ""
) -> Any:
    return await conductor.resolve_compute(
        CTX,
        host=host,
        node_uuid=node_uuid,
        hypervisor_hostname=hypervisor or host,
        identity_file="/var/lib/keel/compute_id",
    )


async def place(pool: asyncpg.Pool, registration: Registration, host: str, node: str) -> UUID:
    """An instance scheduled to the node, with its claim, as the conductor leaves it."""
    instance_uuid = await create_instance(pool)
    async with pool.acquire() as conn:
        assert await allocations.claim(conn, registration.node_id, instance_uuid, SMALL)
        await instances.set_scheduled(
            conn, instance_uuid, host=host, node=node, compute_id=registration.node_id
        )
    return instance_uuid


async def test_new_host_resolves_as_new_and_known_host_as_known(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    before = await dump(db_pool)
    fresh = await resolve(conductor, "cn1", None)
    assert (fresh.decision, fresh.node_uuid) == ("new", None)
    provisioned = uuid.uuid4()
    assert (await resolve(conductor, "cn1", provisioned)).node_uuid == provisioned
    assert await dump(db_pool) == before

    await register(conductor, "cn1", provisioned)
    known = await resolve(conductor, "cn1", provisioned)
    assert (known.decision, known.node_uuid) == ("known", provisioned)


@pytest.mark.parametrize("with_servers", [False, True], ids=["empty", "with-servers"])
async def test_node_of_another_host_is_a_possible_rename(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, with_servers: bool
) -> None:
    first = await register(conductor, "old-name")
    if with_servers:
        await place(db_pool, first, "old-name", "old-name")
    before = await dump(db_pool)

    for attempt in (
        resolve(conductor, "new-name", first.node_uuid),
        register(conductor, "new-name", first.node_uuid),
    ):
        with pytest.raises(HostRenameDetected) as caught:
            await attempt
        message = caught.value.message
        assert message.startswith("Possible rename detected")
        assert f"belongs to host 'old-name', which has {int(with_servers)} server(s)" in message
        assert "keel-manage service rename old-name new-name" in message
    assert await dump(db_pool) == before


@pytest.mark.parametrize("hypervisor", ["cn1", "cn1-renamed"], ids=["same", "new-hypervisor"])
async def test_missing_identity_of_a_registered_host_is_refused(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, hypervisor: str
) -> None:
    first = await register(conductor, "cn1")
    before = await dump(db_pool)

    with pytest.raises(IdentityLost) as caught:
        await resolve(conductor, "cn1", None, hypervisor)

    message = caught.value.message
    assert f"echo {first.node_uuid} > /var/lib/keel/compute_id" in message
    assert f"openstack compute service delete {first.service_uuid}" in message
    assert await dump(db_pool) == before


async def test_replaced_uuid_is_a_duplicate_node_whatever_the_hypervisor_name(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    first = await register(conductor, "cn1")
    before = await dump(db_pool)

    for hypervisor in ("cn1", "other-name"):
        with pytest.raises(DuplicateComputeNode, match=str(first.node_uuid)):
            await resolve(conductor, "cn1", uuid.uuid4(), hypervisor)
        with pytest.raises(DuplicateComputeNode, match=str(first.node_uuid)):
            await register(conductor, "cn1", hypervisor=hypervisor)

    assert await dump(db_pool) == before


async def test_new_host_whose_hypervisor_holds_servers_is_refused(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    first = await register(conductor, "cn1", hypervisor="hv1")
    await place(db_pool, first, "cn1", "hv1")
    before = await dump(db_pool)

    with pytest.raises(HypervisorInUse, match="1 under host 'cn1'"):
        await resolve(conductor, "cn1-new", None, "hv1")
    with pytest.raises(HypervisorInUse):
        await register(conductor, "cn1-new", hypervisor="hv1")

    assert await dump(db_pool) == before
    assert (await resolve(conductor, "cn1-new", None, "hv2")).decision == "new"


async def _as_release(pool: asyncpg.Pool, registration: Registration, version: int) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE services SET version = $2 WHERE uuid = $1", registration.service_uuid, version
        )


async def test_upgrade_from_a_release_without_identity_files_adopts_the_only_node(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    first = await register(conductor, "cn1")
    await _as_release(db_pool, first, STABLE_IDENTITY_VERSION - 1)
    before = await dump(db_pool)

    adopted = await resolve(conductor, "cn1", None)

    assert (adopted.decision, adopted.node_uuid) == ("adopt", first.node_uuid)
    assert await dump(db_pool) == before


async def test_upgrade_with_two_nodes_is_a_lost_identity(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    first = await register(conductor, "cn1")
    async with db_pool.acquire() as conn:
        await conn.execute(
            """INSERT INTO compute_nodes (uuid, service_id, host, hypervisor_hostname,
                                          vcpus, memory_mb, local_gb)
               VALUES ($1, $2, 'cn1', 'cn1-second', 1, 1, 1)""",
            uuid.uuid4(),
            first.service_id,
        )
    await _as_release(db_pool, first, STABLE_IDENTITY_VERSION - 1)
    before = await dump(db_pool)

    with pytest.raises(IdentityLost):
        await resolve(conductor, "cn1", None)

    assert await dump(db_pool) == before


async def test_deleted_node_is_refused_and_never_revived(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    first = await register(conductor, "cn1")
    async with db_pool.acquire() as conn:
        # Its agent registered long ago and stopped: the service may be deleted.
        await conn.execute(
            "UPDATE services SET registered_at = now() - interval '1 hour' WHERE uuid = $1",
            first.service_uuid,
        )
        service = await services.get(conn, first.service_uuid, 60)
        await service_maintenance.delete_service(conn, service, 60)
    before = await dump(db_pool)

    with pytest.raises(ComputeNodeDeleted, match="remove its identity file"):
        await resolve(conductor, "cn1", first.node_uuid)
    with pytest.raises(ComputeNodeDeleted):
        await register(conductor, "cn1", first.node_uuid)

    assert await dump(db_pool) == before
    assert (await resolve(conductor, "cn1", None)).decision == "new"
    again = await register(conductor, "cn1")
    assert again.service_uuid != first.service_uuid


async def test_hypervisor_host_name_change_keeps_the_node_and_is_logged(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, caplog: pytest.LogCaptureFixture
) -> None:
    first = await register(conductor, "cn1", hypervisor="hv-old")
    server = await place(db_pool, first, "cn1", "hv-old")

    with caplog.at_level(logging.WARNING, logger="services.conductor"):
        again = await register(conductor, "cn1", first.node_uuid, hypervisor="hv-new")

    assert (again.node_uuid, again.node_id) == (first.node_uuid, first.node_id)
    assert any("'hv-old' → 'hv-new'" in r.getMessage() for r in caplog.records)
    async with db_pool.acquire() as conn:
        name = await conn.fetchval(
            "SELECT hypervisor_hostname FROM compute_nodes WHERE id = $1", first.node_id
        )
        moved = await instances.get(conn, server)
    assert name == "hv-new"
    assert (moved.node, moved.compute_id) == ("hv-new", first.node_id)

    await conductor.service_heartbeat(
        CTX,
        service_uuid=first.service_uuid,
        version=SERVICE_VERSION,
        node_uuid=first.node_uuid,
        resources=resources("hv-newer"),
    )
    async with db_pool.acquire() as conn:
        assert (await instances.get(conn, server)).node == "hv-newer"


async def test_twin_resolves_and_registrations_agree(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    node_uuid = uuid.uuid4()
    resolved = await asyncio.gather(*(resolve(conductor, "twin", node_uuid) for _ in range(2)))
    assert [r.decision for r in resolved] == ["new", "new"]

    first, second = await asyncio.gather(
        *(register(conductor, "twin", node_uuid) for _ in range(2))
    )

    assert first == second
    async with db_pool.acquire() as conn:
        counts = await conn.fetchrow(
            """SELECT (SELECT count(*) FROM services WHERE host = 'twin') AS services,
                      (SELECT count(*) FROM compute_nodes WHERE host = 'twin') AS nodes"""
        )
    assert counts is not None
    assert (counts["services"], counts["nodes"]) == (1, 1)
