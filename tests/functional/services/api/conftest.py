"""keel-api against a real PostgreSQL and RabbitMQ, driven in-process over ASGI.

The API publishes through a real :class:`AmqpTransport` on the test's own exchange.
:class:`Recorder` stands in for keel-conductor (and, where a test serves its queue, for
a compute agent): it records the casts the API sends, so a test can see them arrive.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.rpcapi import ComputeAPI, TerminateInstance, topic_for
from services.conductor.rpcapi import RPC_VERSION as CONDUCTOR_RPC_VERSION
from services.conductor.rpcapi import BuildInstances, ConductorAPI, UnshelveInstance
from shared.config import AuthSettings, NetworkSettings, RpcSettings, Settings, TokenInfo
from shared.context import RequestContext
from shared.db import compute_nodes, images, instances, services
from shared.objects.compute_node import ComputeNode, NodeResources
from shared.objects.instance import RequestedDestination
from shared.objects.service import Service
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from tests.broker import remove_exchange
from tests.functional.faults import FailsOnce, every_call

#: Bound on waiting for a cast that should arrive almost at once.
SOON = 10.0

ADMIN = {"X-Auth-Token": "admin-token"}
MEMBER = {"X-Auth-Token": "member-token"}
OTHER_MEMBER = {"X-Auth-Token": "other-token"}
IMAGE_ID = UUID("11111111-2222-3333-4444-555555555555")


def at(version: str, headers: dict[str, str] = ADMIN) -> dict[str, str]:
    """``headers`` asking for compute microversion ``version``."""
    return {**headers, "OpenStack-API-Version": f"compute {version}"}


class Recorder:
    """What the API cast to the conductor or to compute agents, in arrival order."""

    def __init__(self) -> None:
        self.builds: asyncio.Queue[tuple[RequestContext, UUID]] = asyncio.Queue()
        #: The requested destination each build carried (None when it carried none).
        self.destinations: dict[UUID, RequestedDestination | None] = {}
        self.terminations: asyncio.Queue[UUID] = asyncio.Queue()
        #: The unshelves of offloaded servers, with the destination each carried.
        self.unshelves: asyncio.Queue[tuple[UUID, RequestedDestination | None]] = asyncio.Queue()

    async def next_build(self) -> tuple[RequestContext, UUID]:
        return await asyncio.wait_for(self.builds.get(), SOON)

    async def next_termination(self) -> UUID:
        return await asyncio.wait_for(self.terminations.get(), SOON)


class _ConductorEndpoint:
    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    async def build_instances(self, ctx: RequestContext, req: BuildInstances) -> None:
        self._recorder.destinations[req.instance_uuid] = req.requested_destination
        await self._recorder.builds.put((ctx, req.instance_uuid))

    async def unshelve_instance(self, ctx: RequestContext, req: UnshelveInstance) -> None:
        await self._recorder.unshelves.put((req.instance_uuid, req.requested_destination))


class _ComputeEndpoint:
    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    async def terminate_instance(self, ctx: RequestContext, req: TerminateInstance) -> None:
        await self._recorder.terminations.put(req.instance_uuid)


class StandInAgents:
    """Compute agents reduced to their queues: they record what they are asked to do."""

    def __init__(self, transport: AmqpTransport, queues: list[str]) -> None:
        self.recorder = Recorder()
        self._transport = transport
        self._queues = queues
        self._servers: list[RPCServer] = []

    async def serve(self, service_uuid: UUID) -> None:
        topic = topic_for(service_uuid)
        server = RPCServer(self._transport, topic, _ComputeEndpoint(self.recorder), version="1.0")
        self._queues.append(topic)
        await server.start()
        self._servers.append(server)

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop(1)


@pytest.fixture
def settings(database_url: str, amqp_url: str, exchange: str) -> Settings:
    tokens = {
        "admin-token": TokenInfo(user_id="root", project_id="ops", roles=["admin", "member"]),
        "member-token": TokenInfo(user_id="alice", project_id="team"),
        "other-token": TokenInfo(user_id="bob", project_id="elsewhere"),
    }
    return Settings(
        database_url=database_url,
        transport_url=amqp_url,
        exchange=exchange,
        auth=AuthSettings(tokens=tokens),
        rpc=RpcSettings(queue_expires=60, connect_timeout=10),
        network=NetworkSettings(cidr="10.0.0.0/24"),
    )


@pytest.fixture
async def queues(amqp_url: str, exchange: str) -> AsyncIterator[list[str]]:
    """Topics a test serves; their queues are deleted with the exchange afterwards."""
    served: list[str] = []
    yield served
    await remove_exchange(exchange, served)


@pytest.fixture
async def transport(
    amqp_url: str, exchange: str, queues: list[str]
) -> AsyncIterator[AmqpTransport]:
    """The API's transport; also used by the recorders, as the other processes."""
    amqp = AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10)
    await amqp.connect()
    yield amqp
    await amqp.close()


@pytest.fixture
async def conductor(transport: AmqpTransport, queues: list[str]) -> AsyncIterator[Recorder]:
    """A stand-in keel-conductor consuming the ``conductor`` queue."""
    recorder = Recorder()
    server = RPCServer(
        transport, "conductor", _ConductorEndpoint(recorder), version=CONDUCTOR_RPC_VERSION
    )
    queues.append("conductor")
    await server.start()
    yield recorder
    await server.stop(1)


@pytest.fixture
async def agents(transport: AmqpTransport, queues: list[str]) -> AsyncIterator[StandInAgents]:
    stand_ins = StandInAgents(transport, queues)
    yield stand_ins
    await stand_ins.stop()


@pytest.fixture
async def client(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, db_pool, ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http


async def add_image(
    pool: asyncpg.Pool,
    name: str = "cirros",
    image_id: UUID = IMAGE_ID,
    *,
    visibility: str = "public",
    owner: str | None = None,
    min_ram: int = 0,
) -> UUID:
    async with pool.acquire() as conn:
        image = await images.create(
            conn,
            image_id=image_id,
            name=name,
            visibility=visibility,
            owner=owner,
            min_ram=min_ram,
        )
    return image.id


async def add_compute(
    pool: asyncpg.Pool, host: str, *, up: bool = True, zone: str = "nova"
) -> tuple[Service, ComputeNode]:
    """A registered compute service and its node; ``up`` if it has just heartbeaten."""
    async with pool.acquire() as conn:
        service = await services.get_or_create(
            conn, host=host, binary="keel-compute", topic="compute", version=1, down_time=60
        )
        if up:
            await services.heartbeat(conn, service.uuid, 1)
        node = await compute_nodes.upsert(
            conn,
            node_uuid=uuid.uuid4(),
            service_id=service.id,
            host=host,
            resources=NodeResources(
                hypervisor_hostname=host,
                vcpus=8,
                memory_mb=16384,
                local_gb=200,
                cpu_allocation_ratio=4.0,
                ram_allocation_ratio=1.0,
                disk_allocation_ratio=1.0,
                availability_zone=zone,
            ),
        )
        service = await services.get(conn, service.uuid, 60)
    return service, node


async def place_on(pool: asyncpg.Pool, server_id: str, node: ComputeNode) -> None:
    """Record the server as scheduled to ``node``, as the conductor does."""
    async with pool.acquire() as conn:
        placed = await instances.set_scheduled(
            conn,
            uuid.UUID(server_id),
            host=node.host,
            node=node.hypervisor_hostname,
            compute_id=node.id,
        )
    assert placed is not None


#: A write sent by :func:`every_fault`, and a look at what it changes.
Send = Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]
Look = Callable[[], Awaitable[Any]]
_faults = itertools.count()


@dataclass
class Faulty:
    """keel-api on a pool whose calls fail once when armed, and that pool."""

    client: httpx.AsyncClient
    pool: FailsOnce


@pytest.fixture
async def faulty(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> AsyncIterator[Faulty]:
    """keel-api on the test's database through a :class:`FailsOnce` pool, which fails
    nothing until armed."""
    flaky = FailsOnce(db_pool, None)
    app = create_app(settings, flaky.as_pool(), ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as client:
        yield Faulty(client, flaky)


async def every_fault(
    faulty: Faulty,
    client: httpx.AsyncClient,
    answered: bool,
    write: Callable[[str], Awaitable[tuple[Send, Look]]],
    *,
    done: int,
    again: frozenset[int] = frozenset(),
) -> int:
    """Send a write through ``faulty`` with each of its calls failing in turn, then again
    through ``client``: 503 (or, past its last call, its answer), what it wrote whole
    or absent in between, and whole once sent again. Each scenario writes something of
    its own, made by ``write(name)``. How many calls the write makes."""

    async def scenario(at: int) -> FailsOnce:
        send, look = await write(f"fault-{next(_faults)}")
        before = await look()
        flaky = faulty.pool
        flaky.arm(at, answered=answered)
        first = await send(faulty.client)
        between = await look()
        retried = await send(client)
        after = await look()
        what = (flaky.calls, before, between, after, first.text, retried.text)
        assert first.status_code == (503 if flaky.failed else done), what
        assert between in (before, after), what
        assert after != before, what
        assert retried.status_code == done or retried.status_code in again, what
        return flaky

    return await every_call(scenario)
