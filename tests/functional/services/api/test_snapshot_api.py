"""``createImage`` through the API, over real PostgreSQL and RabbitMQ: what it checks,
writes and answers at each microversion, the agent's signed upload, the conductor's
result (twice at once), and the 503 that leaves no image behind."""

from __future__ import annotations

import asyncio
import hashlib
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
from services.compute.rpcapi import ComputeAPI, SnapshotInstance, topic_for
from services.conductor import instance_events
from services.conductor.deadlines import TaskDeadline
from services.conductor.rpcapi import ConductorAPI, InstanceActionResult, PowerAction
from shared.config import ImageSettings, Settings
from shared.context import RequestContext
from shared.db import allocations, images, instances
from shared.exceptions import MessagingTimeout
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from tests.functional.services.api.conftest import (
    IMAGE_ID,
    MEMBER,
    OTHER_MEMBER,
    SOON,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_publish_outcomes import takes_requests
from tests.functional.services.api.test_servers import server_body

pytestmark = [pytest.mark.functional, pytest.mark.usefixtures("conductor")]

SECRET = "functional-snapshot-secret"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    images_settings = ImageSettings(store_dir=tmp_path / "store", url_secret=SECRET)
    return settings.model_copy(update={"images": images_settings})


class _Endpoint:
    def __init__(self, requests: asyncio.Queue[tuple[RequestContext, SnapshotInstance]]) -> None:
        self._requests = requests

    async def snapshot_instance(self, ctx: RequestContext, req: SnapshotInstance) -> None:
        await self._requests.put((ctx, req))


class SnapshotRecorder:
    """Stand-in agents: the snapshot requests they are sent."""

    def __init__(self, transport: AmqpTransport, queues: list[str]) -> None:
        self.requests: asyncio.Queue[tuple[RequestContext, SnapshotInstance]] = asyncio.Queue()
        self._transport = transport
        self._queues = queues
        self.servers: list[RPCServer] = []

    async def serve(self, service_uuid: UUID) -> None:
        topic = topic_for(service_uuid)
        endpoint = _Endpoint(self.requests)
        server = RPCServer(self._transport, topic, endpoint, version=COMPUTE_RPC_VERSION)
        self._queues.append(topic)
        await server.start()
        self.servers.append(server)

    async def next(self) -> tuple[RequestContext, SnapshotInstance]:
        return await asyncio.wait_for(self.requests.get(), SOON)


@pytest.fixture
async def agent(transport: AmqpTransport, queues: list[str]) -> AsyncIterator[SnapshotRecorder]:
    recorder = SnapshotRecorder(transport, queues)
    yield recorder
    for server in recorder.servers:
        await server.stop(1)


async def server_on(
    client: httpx.AsyncClient, pool: asyncpg.Pool, agent: SnapshotRecorder | None, host: str
) -> str:
    await add_image(pool)
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE images SET min_ram = 64, disk_format = 'raw',
                      properties = '{"os_distro": "cirros", "hw_disk_bus": "virtio"}'
                WHERE id = $1""",
            IMAGE_ID,
        )
    service, node = await add_compute(pool, host)
    await takes_requests(pool, host)
    if agent is not None:
        await agent.serve(service.uuid)
    created = await client.post("/v2.1/servers", headers=MEMBER, json=server_body())
    assert created.status_code == 202, created.text
    server_id: str = created.json()["server"]["id"]
    await place_on(pool, server_id, node)
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET image_properties = '{"hw_disk_bus": "virtio"}'
                WHERE uuid = $1""",
            UUID(server_id),
        )
        instance = await instances.set_active(conn, UUID(server_id))
        assert instance is not None
        assert await allocations.claim(conn, node.id, instance.uuid, instance.flavor)
    return server_id


async def create_image(
    client: httpx.AsyncClient, server_id: str, value: Any, headers: dict[str, str] = MEMBER
) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server_id}/action", headers=headers, json={"createImage": value}
    )


async def state(pool: asyncpg.Pool, server_id: str) -> tuple[str, str | None]:
    async with pool.acquire() as conn:
        instance = await instances.get(conn, UUID(server_id))
    return instance.vm_state, instance.task_state


async def image_row(pool: asyncpg.Pool, image_id: str) -> Any:
    async with pool.acquire() as conn:
        return await conn.fetchrow("SELECT * FROM images WHERE id = $1", UUID(image_id))


def upload_path(url: str) -> str:
    return url.removeprefix("http://127.0.0.1:8774")


async def test_a_snapshot_is_recorded_uploaded_by_its_agent_and_ended_by_its_result(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder, settings: Settings
) -> None:
    server_id = await server_on(client, db_pool, agent, "snap-a")

    answer = await create_image(client, server_id, {"name": "snap", "metadata": {"k": "v"}})

    assert answer.status_code == 202, answer.text
    location = answer.headers["location"]
    image_id = location.rsplit("/", 1)[-1]
    assert location == f"http://keel.test/image/v2/images/{image_id}"
    assert await state(db_pool, server_id) == ("active", "image_snapshot")
    row = await image_row(db_pool, image_id)
    assert (row["status"], row["visibility"], row["owner"], row["name"]) == (
        "queued",
        "private",
        "team",
        "snap",
    )
    assert (row["disk_format"], row["min_ram"], row["min_disk"]) == ("raw", 64, 1)
    props = row["properties"]
    assert props["image_type"] == "snapshot"
    assert props["instance_uuid"] == server_id
    assert props["base_image_ref"] == str(IMAGE_ID)
    assert (props["user_id"], props["owner_id"]) == ("alice", "team")
    assert (props["k"], props["hw_disk_bus"], props["os_distro"]) == ("v", "virtio", "cirros")
    ctx, req = await agent.next()
    assert (str(req.instance_uuid), str(req.image_id), req.disk_format) == (
        server_id,
        image_id,
        "raw",
    )
    shown = (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).json()["server"]
    assert (shown["status"], shown["OS-EXT-STS:task_state"]) == ("ACTIVE", "image_snapshot")
    again = await create_image(client, server_id, {"name": "twice"})
    assert again.status_code == 409
    assert "task_state image_snapshot" in again.text

    data = b"disk bytes " * 200_000  # more than keel-api takes in any other body
    assert len(data) > settings.api.max_body_bytes
    put = await client.put(upload_path(req.upload_url), content=data)

    assert put.status_code == 204, put.text
    assert await state(db_pool, server_id) == ("active", "image_uploading")
    row = await image_row(db_pool, image_id)
    assert (row["status"], row["size"]) == ("active", len(data))
    assert row["checksum"] == hashlib.md5(data, usedforsecurity=False).hexdigest()
    assert row["os_hash_value"] == hashlib.sha512(data).hexdigest()
    fetched = await client.get(f"/image/v2/images/{image_id}/file", headers=MEMBER)
    assert fetched.content == data
    assert (await client.put(upload_path(req.upload_url), content=b"more")).status_code == 409

    result = InstanceActionResult(
        instance_uuid=UUID(server_id), action=PowerAction.SNAPSHOT, success=True
    )
    await asyncio.gather(
        instance_events.record_action_result(db_pool, result),
        instance_events.record_action_result(db_pool, result),
    )

    assert await state(db_pool, server_id) == ("active", None)
    assert (await image_row(db_pool, image_id))["status"] == "active"
    actions = await client.get(f"/v2.1/servers/{server_id}/os-instance-actions", headers=MEMBER)
    recorded = [a for a in actions.json()["instanceActions"] if a["action"] == "createImage"]
    assert len(recorded) == 1
    assert recorded[0]["request_id"] == ctx.request_id


async def test_from_2_45_the_answer_is_the_image_id(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "snap-245")

    answer = await create_image(client, server_id, {"name": "snap"}, at("2.45", MEMBER))

    assert answer.status_code == 202, answer.text
    assert "location" not in answer.headers
    image_id = answer.json()["image_id"]
    assert (await image_row(db_pool, image_id))["status"] == "queued"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": " padded "}, "whitespace"),
        ({"name": "x", "flavor": "1"}, "flavor"),
        ({"name": "x", "metadata": {"k": 1}}, "metadata"),
        ({"name": "x", "metadata": "text"}, "metadata"),
        ("snap", "object"),
    ],
)
async def test_a_bad_body_is_a_400_and_changes_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, value: Any, words: str
) -> None:
    server_id = await server_on(client, db_pool, None, f"snap-bad-{abs(hash(words)) % 10**6}")

    answer = await create_image(client, server_id, value)

    assert answer.status_code == 400, answer.text
    assert words in answer.text
    assert await state(db_pool, server_id) == ("active", None)
    async with db_pool.acquire() as conn:
        assert len(await images.list_images(conn)) == 1


async def test_refused_in_error_locked_unsigned_or_over_the_metadata_quota(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    agent: SnapshotRecorder,
    settings: Settings,
    transport: AmqpTransport,
) -> None:
    server_id = await server_on(client, db_pool, agent, "snap-refused")
    too_many = {f"k{n}": "v" for n in range(200)}

    over = await create_image(client, server_id, {"name": "x", "metadata": too_many})
    assert over.status_code == 403, over.text

    await client.post(f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={"lock": None})
    assert (await create_image(client, server_id, {"name": "x"})).status_code == 409
    await client.post(f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={"unlock": None})

    unsigned = settings.model_copy(update={"images": ImageSettings()})
    app = create_app(unsigned, db_pool, ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as plain:
        refused = await create_image(plain, server_id, {"name": "x"})
    assert refused.status_code == 409
    assert "KEEL_IMAGES__URL_SECRET" in refused.text

    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'error' WHERE uuid = $1", UUID(server_id)
        )
    errored = await create_image(client, server_id, {"name": "x"})
    assert errored.status_code == 409
    assert "vm_state error" in errored.text
    async with db_pool.acquire() as conn:
        assert len(await images.list_images(conn)) == 1


async def test_a_forged_or_download_url_cannot_upload(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "snap-forged")
    answer = await create_image(client, server_id, {"name": "snap"}, at("2.45", MEMBER))
    image_id = answer.json()["image_id"]
    _, req = await agent.next()
    path, _, query = upload_path(req.upload_url).partition("?")
    download_query = query.replace("signature=", "signature=0")

    forged = await client.put(f"{path}?{download_query}", content=b"x")
    as_download = await client.put(path.replace("/upload/", "/download/") + "?" + query)
    other = await client.put(f"/image/upload/{IMAGE_ID}?{query}", content=b"x")

    assert forged.status_code == 403
    assert as_download.status_code == 405
    assert other.status_code == 403
    assert (await image_row(db_pool, image_id))["status"] == "queued"
    assert await state(db_pool, server_id) == ("active", "image_snapshot")


async def test_a_failed_result_kills_the_image_and_leaves_the_server_as_it_was(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "snap-failed")
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'stopped' WHERE uuid = $1", UUID(server_id)
        )
    answer = await create_image(client, server_id, {"name": "snap"}, at("2.45", MEMBER))
    image_id = answer.json()["image_id"]
    failed = InstanceActionResult(
        instance_uuid=UUID(server_id),
        action=PowerAction.SNAPSHOT,
        success=False,
        message="qemu-img could not convert the disk",
    )

    await asyncio.gather(
        instance_events.record_action_result(db_pool, failed),
        instance_events.record_action_result(db_pool, failed),
    )

    assert await state(db_pool, server_id) == ("stopped", None)
    row = await image_row(db_pool, image_id)
    assert row["status"] == "killed"
    assert row["deleted_at"] is not None
    shown = await client.get(f"/image/v2/images/{image_id}", headers=MEMBER)
    assert shown.status_code == 404


async def test_a_snapshot_past_the_task_deadline_is_ended_and_its_image_killed(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "snap-deadline")
    answer = await create_image(client, server_id, {"name": "snap"}, at("2.45", MEMBER))
    image_id = answer.json()["image_id"]
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET task_state = 'image_uploading',
                      updated_at = now() - interval '1 hour' WHERE uuid = $1""",
            UUID(server_id),
        )

    ended = await asyncio.gather(
        TaskDeadline(db_pool, 60).sweep(), TaskDeadline(db_pool, 60).sweep()
    )

    assert sum(ended) == 1
    assert await state(db_pool, server_id) == ("active", None)
    assert (await image_row(db_pool, image_id))["status"] == "killed"


class LosingCompute(ComputeAPI):
    """Every snapshot cast is lost, as a dropped connection loses it."""

    attempts = 0

    async def snapshot_instance(
        self, ctx: RequestContext, service_uuid: UUID, req: SnapshotInstance
    ) -> None:
        self.attempts += 1
        raise MessagingTimeout("the connection closed before the broker confirmed it")


async def test_a_snapshot_that_cannot_be_sent_is_503_and_leaves_no_image(
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
        server_id = await server_on(client, db_pool, None, "snap-lost")

        answer = await create_image(client, server_id, {"name": "lost"})
        listed = await client.get("/image/v2/images", headers=MEMBER)

    assert answer.status_code == 503, answer.text
    assert compute.attempts == publish.ATTEMPTS
    assert await state(db_pool, server_id) == ("active", None)
    assert [image["name"] for image in listed.json()["images"]] == ["cirros"]


async def test_another_project_cannot_see_or_snapshot_the_server(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "snap-other")

    answer = await create_image(client, server_id, {"name": "x"}, OTHER_MEMBER)

    assert answer.status_code == 404
    assert await state(db_pool, server_id) == ("active", None)


async def test_metadata_may_say_another_image_type_and_the_snapshot_still_completes(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    """As Nova, the request's metadata goes over the snapshot's properties (Tempest sets
    ``image_type``); the image is still known as the server's snapshot."""
    server_id = await server_on(client, db_pool, agent, "snap-typed")
    body = {"name": "snap", "metadata": {"image_type": "test", "instance_uuid": "forged"}}

    answer = await create_image(client, server_id, body, at("2.45", MEMBER))
    image_id = answer.json()["image_id"]
    _, req = await agent.next()
    put = await client.put(upload_path(req.upload_url), content=b"data")
    tasks = await client.get(f"/image/v2/images/{image_id}/tasks", headers=MEMBER)

    assert put.status_code == 204, put.text
    row = await image_row(db_pool, image_id)
    assert row["status"] == "active"
    assert (row["properties"]["image_type"], row["properties"]["instance_uuid"]) == (
        "test",
        server_id,
    )
    assert tasks.json() == {"tasks": []}


async def test_a_blank_image_id_is_not_found(client: httpx.AsyncClient) -> None:
    answer = await client.delete("/v2.1/images/", headers=MEMBER)

    assert answer.status_code == 404, answer.text
