"""``shelve``, ``shelveOffload`` and ``unshelve`` through the API, over real PostgreSQL and
RabbitMQ: what each checks, writes and casts, its refusals (400, 403, 409, 503) that
change nothing, and requests sent twice at once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.api.servers import publish
from services.compute.rpcapi import RPC_VERSION as COMPUTE_RPC_VERSION
from services.compute.rpcapi import ComputeAPI, GuestAction, ShelveInstance, topic_for
from services.conductor.rpcapi import ConductorAPI
from shared.config import ImageSettings, Settings
from shared.context import RequestContext
from shared.db import allocations, instances, request_specs, shelves
from shared.exceptions import MessagingTimeout, Unroutable
from shared.objects.instance import Instance, RequestedDestination
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from tests.functional.services.api.conftest import (
    ADMIN,
    IMAGE_ID,
    MEMBER,
    OTHER_MEMBER,
    SOON,
    Recorder,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_publish_outcomes import takes_requests
from tests.functional.services.api.test_servers import server_body

pytestmark = [pytest.mark.functional, pytest.mark.usefixtures("conductor")]

SECRET = "functional-shelve-secret"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    images_settings = ImageSettings(store_dir=tmp_path / "store", url_secret=SECRET)
    return settings.model_copy(update={"images": images_settings})


class _Endpoint:
    def __init__(self, agent: ShelveAgent) -> None:
        self._agent = agent

    async def shelve_instance(self, ctx: RequestContext, req: ShelveInstance) -> None:
        await self._agent.shelves.put(req)

    async def shelve_offload_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        await self._agent.offloads.put(req.instance_uuid)

    async def unshelve_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        await self._agent.power_ons.put(req.instance_uuid)


class ShelveAgent:
    """Stand-in agents: what they are asked to shelve, offload and power on."""

    def __init__(self, transport: AmqpTransport, queues: list[str]) -> None:
        self.shelves: asyncio.Queue[ShelveInstance] = asyncio.Queue()
        self.offloads: asyncio.Queue[UUID] = asyncio.Queue()
        self.power_ons: asyncio.Queue[UUID] = asyncio.Queue()
        self._transport = transport
        self._queues = queues
        self.servers: list[RPCServer] = []

    async def serve(self, service_uuid: UUID) -> None:
        topic = topic_for(service_uuid)
        server = RPCServer(self._transport, topic, _Endpoint(self), version=COMPUTE_RPC_VERSION)
        self._queues.append(topic)
        await server.start()
        self.servers.append(server)


@pytest.fixture
async def agent(transport: AmqpTransport, queues: list[str]) -> AsyncIterator[ShelveAgent]:
    stand_in = ShelveAgent(transport, queues)
    yield stand_in
    for server in stand_in.servers:
        await server.stop(1)


async def server_on(
    client: httpx.AsyncClient, pool: asyncpg.Pool, agent: ShelveAgent | None, host: str
) -> UUID:
    await add_image(pool)
    service, node = await add_compute(pool, host)
    await takes_requests(pool, host)
    if agent is not None:
        await agent.serve(service.uuid)
    created = await client.post("/v2.1/servers", headers=MEMBER, json=server_body("web-1"))
    assert created.status_code == 202, created.text
    server_id = created.json()["server"]["id"]
    await place_on(pool, server_id, node)
    async with pool.acquire() as conn:
        instance = await instances.set_active(conn, UUID(server_id))
        assert instance is not None
        assert await allocations.claim(conn, node.id, instance.uuid, instance.flavor)
    return UUID(server_id)


async def act(
    client: httpx.AsyncClient, server: UUID, body: dict[str, Any], headers: dict[str, str]
) -> httpx.Response:
    return await client.post(f"/v2.1/servers/{server}/action", headers=headers, json=body)


async def row(pool: asyncpg.Pool, server: UUID) -> Instance:
    async with pool.acquire() as conn:
        return await instances.get(conn, server)


async def shown(client: httpx.AsyncClient, server: UUID) -> dict[str, Any]:
    answer = await client.get(f"/v2.1/servers/{server}", headers=at("2.91", ADMIN))
    body: dict[str, Any] = answer.json()["server"]
    return body


async def offloaded_server(
    client: httpx.AsyncClient, pool: asyncpg.Pool, agent: ShelveAgent, host: str
) -> UUID:
    """A server shelved and offloaded, as the conductor leaves it."""
    server = await server_on(client, pool, agent, host)
    assert (await act(client, server, {"shelve": None}, MEMBER)).status_code == 202
    await asyncio.wait_for(agent.shelves.get(), SOON)
    async with pool.acquire() as conn:
        assert await shelves.shelved(conn, server, offload=True) is not None
        assert await shelves.offloaded(conn, server) is not None
    return server


async def test_shelve_records_the_task_and_the_shelved_image_and_asks_the_agent(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: ShelveAgent
) -> None:
    server = await server_on(client, db_pool, agent, "shelve-a")

    answers = await asyncio.gather(
        act(client, server, {"shelve": None}, MEMBER),
        act(client, server, {"shelve": None}, MEMBER),
    )

    assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
    req = await asyncio.wait_for(agent.shelves.get(), SOON)
    assert req.instance_uuid == server
    assert agent.shelves.empty()
    instance = await row(db_pool, server)
    assert (instance.vm_state, instance.task_state) == ("active", "shelving")
    assert instance.system_metadata == {shelves.IMAGE_KEY: str(req.image_id)}
    image = await client.get(f"/image/v2/images/{req.image_id}", headers=MEMBER)
    assert (image.json()["name"], image.json()["status"]) == ("web-1-shelved", "queued")
    assert image.json()["instance_uuid"] == str(server)
    assert f"/image/upload/{req.image_id}?" in req.upload_url
    view = await shown(client, server)
    assert (view["status"], view["OS-EXT-STS:task_state"]) == ("ACTIVE", "shelving")
    listed = await client.get(f"/v2.1/servers/{server}/os-instance-actions", headers=MEMBER)
    assert [a["action"] for a in listed.json()["instanceActions"]].count("shelve") == 1


async def test_shelved_and_offloaded_servers_show_as_nova_shows_them(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: ShelveAgent
) -> None:
    server = await server_on(client, db_pool, agent, "shelve-show")
    assert (await act(client, server, {"shelve": None}, MEMBER)).status_code == 202
    await asyncio.wait_for(agent.shelves.get(), SOON)
    async with db_pool.acquire() as conn:
        assert await shelves.shelved(conn, server, offload=False) is not None

    kept = await shown(client, server)
    assert (kept["status"], kept["OS-EXT-STS:vm_state"], kept["OS-EXT-STS:power_state"]) == (
        "SHELVED",
        "shelved",
        4,
    )
    assert kept["OS-EXT-SRV-ATTR:host"] == "shelve-show"
    async with db_pool.acquire() as conn:
        assert await shelves.begin_offload(conn, server) is not None
        assert await shelves.offloaded(conn, server) is not None
    gone = await shown(client, server)
    assert (gone["status"], gone["OS-EXT-STS:vm_state"]) == (
        "SHELVED_OFFLOADED",
        "shelved_offloaded",
    )
    assert gone["OS-EXT-SRV-ATTR:host"] is None
    assert gone["OS-EXT-SRV-ATTR:hypervisor_hostname"] is None
    listed = await client.get("/v2.1/servers/detail?status=SHELVED_OFFLOADED", headers=MEMBER)
    assert [s["id"] for s in listed.json()["servers"]] == [str(server)]


@pytest.mark.parametrize(
    ("action", "value"),
    [("shelve", {"x": 1}), ("shelve", "now"), ("shelveOffload", [1]), ("unshelve", "az")],
)
async def test_a_bad_body_is_a_400_and_changes_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, action: str, value: Any
) -> None:
    server = await server_on(client, db_pool, None, f"shelve-bad-{uuid.uuid4().hex[:6]}")

    answer = await act(client, server, {action: value}, ADMIN)

    assert answer.status_code == 400, answer.text
    instance = await row(db_pool, server)
    assert (instance.vm_state, instance.task_state, instance.system_metadata) == (
        "active",
        None,
        {},
    )


async def test_refusals_change_nothing(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    agent: ShelveAgent,
    settings: Settings,
    transport: AmqpTransport,
) -> None:
    server = await server_on(client, db_pool, agent, "shelve-refused")

    assert (await act(client, server, {"unshelve": None}, MEMBER)).status_code == 409
    assert (await act(client, server, {"shelveOffload": None}, ADMIN)).status_code == 409
    forbidden = await act(client, server, {"shelveOffload": None}, MEMBER)
    assert forbidden.status_code == 403
    assert "os_compute_api:os-shelve:shelve_offload" in forbidden.text
    assert (await act(client, server, {"shelve": None}, OTHER_MEMBER)).status_code == 404

    await act(client, server, {"lock": None}, MEMBER)
    assert (await act(client, server, {"shelve": None}, MEMBER)).status_code == 409
    await act(client, server, {"unlock": None}, MEMBER)

    old = ComputeAPI(transport, version_cap="1.16")
    pinned = create_app(settings, db_pool, ConductorAPI(transport), old)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=pinned), base_url="http://keel.test"
    ) as older:
        too_old = await act(older, server, {"shelve": None}, MEMBER)
    assert too_old.status_code == 409
    assert "1.17" in too_old.text

    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE instances SET vm_state = 'error' WHERE uuid = $1", server)
    errored = await act(client, server, {"shelve": None}, MEMBER)
    assert errored.status_code == 409
    assert "vm_state error" in errored.text
    instance = await row(db_pool, server)
    assert (instance.task_state, instance.system_metadata) == (None, {})
    assert agent.shelves.empty()


async def test_shelve_offload_of_a_shelved_server_clears_its_copy_and_asks_its_agent(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: ShelveAgent
) -> None:
    server = await server_on(client, db_pool, agent, "shelve-offload")
    token = (await row(db_pool, server)).copy_token
    assert (await act(client, server, {"shelve": None}, MEMBER)).status_code == 202
    await asyncio.wait_for(agent.shelves.get(), SOON)
    async with db_pool.acquire() as conn:
        assert await shelves.shelved(conn, server, offload=False) is not None

    answers = await asyncio.gather(
        act(client, server, {"shelveOffload": None}, ADMIN),
        act(client, server, {"shelveOffload": None}, ADMIN),
    )

    assert sorted(a.status_code for a in answers) == [202, 409]
    assert await asyncio.wait_for(agent.offloads.get(), SOON) == server
    instance = await row(db_pool, server)
    assert (instance.vm_state, instance.task_state) == ("shelved", "shelving_offloading")
    assert instance.copy_token not in (None, token)
    assert instance.host == "shelve-offload"


async def test_unshelve_of_a_shelved_server_powers_it_on_where_it_is(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: ShelveAgent
) -> None:
    server = await server_on(client, db_pool, agent, "shelve-inplace")
    assert (await act(client, server, {"shelve": None}, MEMBER)).status_code == 202
    await asyncio.wait_for(agent.shelves.get(), SOON)
    async with db_pool.acquire() as conn:
        assert await shelves.shelved(conn, server, offload=False) is not None

    zoned = await act(client, server, {"unshelve": {"availability_zone": "nova"}}, at("2.77"))
    assert zoned.status_code == 409, zoned.text
    answer = await act(client, server, {"unshelve": None}, MEMBER)

    assert answer.status_code == 202, answer.text
    assert await asyncio.wait_for(agent.power_ons.get(), SOON) == server
    instance = await row(db_pool, server)
    assert (instance.vm_state, instance.task_state) == ("shelved", "unshelving")


async def test_unshelve_of_an_offloaded_server_is_cast_to_the_conductor_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: ShelveAgent, conductor: Recorder
) -> None:
    server = await offloaded_server(client, db_pool, agent, "shelve-unshelve")
    before = (await row(db_pool, server)).copy_token

    answers = await asyncio.gather(
        act(client, server, {"unshelve": None}, MEMBER),
        act(client, server, {"unshelve": None}, MEMBER),
    )

    assert sorted(a.status_code for a in answers) == [202, 409]
    cast, destination = await asyncio.wait_for(conductor.unshelves.get(), SOON)
    assert (cast, destination) == (server, None)
    instance = await row(db_pool, server)
    assert (instance.vm_state, instance.task_state) == ("shelved_offloaded", "unshelving")
    assert instance.copy_token not in (None, before)
    view = await shown(client, server)
    assert (view["status"], view["OS-EXT-STS:task_state"]) == ("SHELVED_OFFLOADED", "unshelving")


async def test_unshelve_into_a_zone_or_onto_a_host(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: ShelveAgent, conductor: Recorder
) -> None:
    server = await offloaded_server(client, db_pool, agent, "shelve-az")
    await add_compute(db_pool, "shelve-az-2", zone="az2")

    def body(**value: object) -> dict[str, Any]:
        return {"unshelve": value}

    before_277 = await act(client, server, body(availability_zone="az2"), at("2.76", MEMBER))
    unknown = await act(client, server, body(availability_zone="nowhere"), at("2.77", MEMBER))
    null_277 = await act(client, server, body(availability_zone=None), at("2.77", MEMBER))
    host_290 = await act(client, server, body(host="shelve-az-2"), at("2.90"))
    member_host = await act(client, server, body(host="shelve-az-2"), at("2.91", MEMBER))
    no_host = await act(client, server, body(host="nohost"), at("2.91"))
    wrong_zone = await act(
        client, server, body(host="shelve-az-2", availability_zone="nova"), at("2.91")
    )
    assert [
        a.status_code
        for a in (before_277, unknown, null_277, host_290, member_host, no_host, wrong_zone)
    ] == [400, 400, 400, 400, 403, 400, 400]
    assert "nowhere" in unknown.text
    assert (await row(db_pool, server)).task_state is None
    assert conductor.unshelves.empty()

    both = body(availability_zone="az2", host="shelve-az-2")
    answer = await act(client, server, both, at("2.91"))

    assert answer.status_code == 202, answer.text
    cast, destination = await asyncio.wait_for(conductor.unshelves.get(), SOON)
    assert cast == server
    assert destination is not None
    assert destination.host == "shelve-az-2"
    async with db_pool.acquire() as conn:
        assert await request_specs.lock_pinned_zone(conn, server) == (True, "az2")


async def test_deleting_an_offloaded_server_deletes_its_shelved_image(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: ShelveAgent
) -> None:
    server = await offloaded_server(client, db_pool, agent, "shelve-delete")
    image_id = shelves.shelved_image(await row(db_pool, server))

    answer = await client.delete(f"/v2.1/servers/{server}", headers=MEMBER)

    assert answer.status_code == 204
    assert (await client.get(f"/v2.1/servers/{server}", headers=MEMBER)).status_code == 404
    assert (await client.get(f"/image/v2/images/{image_id}", headers=MEMBER)).status_code == 404


async def test_a_protected_shelved_image_outlives_its_deleted_server(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: ShelveAgent
) -> None:
    """Nova's deletion of the shelved image is refused by the Image API when its owner
    protected it, and Nova goes on: the server is deleted, the image stays."""
    server = await offloaded_server(client, db_pool, agent, "shelve-protected")
    image_id = shelves.shelved_image(await row(db_pool, server))
    protected = await client.patch(
        f"/image/v2/images/{image_id}",
        headers={**MEMBER, "Content-Type": "application/openstack-images-v2.1-json-patch"},
        json=[{"op": "replace", "path": "/protected", "value": True}],
    )
    assert protected.status_code == 200, protected.text

    answer = await client.delete(f"/v2.1/servers/{server}", headers=MEMBER)

    assert answer.status_code == 204, answer.text
    assert (await client.get(f"/v2.1/servers/{server}", headers=MEMBER)).status_code == 404
    kept = await client.get(f"/image/v2/images/{image_id}", headers=MEMBER)
    assert kept.status_code == 200, kept.text
    assert kept.json()["protected"] is True


class LosingCompute(ComputeAPI):
    """Every shelve cast is lost, as a dropped connection loses it."""

    attempts = 0

    async def shelve_instance(
        self, ctx: RequestContext, service_uuid: UUID, req: ShelveInstance
    ) -> None:
        self.attempts += 1
        raise MessagingTimeout("the connection closed before the broker confirmed it")


async def test_a_shelve_that_cannot_be_sent_is_503_and_leaves_no_image(
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(publish, "PAUSE", 0.01)
    compute = LosingCompute(transport)
    app = create_app(settings, db_pool, ConductorAPI(transport), compute)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as client:
        server = await server_on(client, db_pool, None, "shelve-lost")

        answer = await act(client, server, {"shelve": None}, MEMBER)
        listed = await client.get("/image/v2/images", headers=MEMBER)

    assert answer.status_code == 503, answer.text
    assert compute.attempts == publish.ATTEMPTS
    instance = await row(db_pool, server)
    assert (instance.vm_state, instance.task_state, instance.system_metadata) == (
        "active",
        None,
        {},
    )
    assert [image["id"] for image in listed.json()["images"]] == [str(IMAGE_ID)]


class NoConductor(ConductorAPI):
    """No keel-conductor consumes its queue."""

    async def unshelve_instance(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        requested_destination: RequestedDestination | None = None,
    ) -> None:
        raise Unroutable("no queue is bound for topic 'conductor'")


async def test_an_unshelve_no_conductor_can_take_is_503_and_changes_nothing(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport, agent: ShelveAgent
) -> None:
    app = create_app(settings, db_pool, NoConductor(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as client:
        server = await offloaded_server(client, db_pool, agent, "shelve-no-conductor")
        before = await row(db_pool, server)

        answer = await act(client, server, {"unshelve": None}, MEMBER)

    assert answer.status_code == 503, answer.text
    after = await row(db_pool, server)
    assert (after.vm_state, after.task_state, after.host) == ("shelved_offloaded", None, None)
    assert after.system_metadata == before.system_metadata
