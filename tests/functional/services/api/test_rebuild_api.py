"""``rebuild`` through the API: what it checks, writes and answers at each microversion,
and the 503 that leaves the server as it was. Real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.api.servers import publish
from services.compute.rpcapi import ComputeAPI, InstanceSpec
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.db import allocations, instance_actions, instances
from shared.exceptions import MessagingTimeout
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    StandInAgents,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_publish_outcomes import takes_requests
from tests.functional.services.api.test_servers import server_body

pytestmark = [pytest.mark.functional, pytest.mark.usefixtures("conductor")]

ALT_IMAGE = UUID("5f2b9a44-8e0d-4c7a-b1a3-6d2e4f9c0b17")


async def active_server(
    client: httpx.AsyncClient,
    pool: asyncpg.Pool,
    agents: StandInAgents | None,
    host: str,
) -> str:
    await add_image(pool)
    await add_image(pool, "cirros-alt", ALT_IMAGE)
    service, node = await add_compute(pool, host)
    await takes_requests(pool, host)
    if agents is not None:
        await agents.serve(service.uuid)
    created = await client.post("/v2.1/servers", headers=MEMBER, json=server_body())
    assert created.status_code == 202, created.text
    server_id: str = created.json()["server"]["id"]
    await place_on(pool, server_id, node)
    async with pool.acquire() as conn:
        instance = await instances.set_active(conn, UUID(server_id))
        assert instance is not None
        assert await allocations.claim(conn, node.id, instance.uuid, instance.flavor)
    return server_id


async def rebuild(
    client: httpx.AsyncClient,
    server_id: str,
    value: Any,
    *,
    headers: dict[str, str] = MEMBER,
) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server_id}/action", headers=headers, json={"rebuild": value}
    )


async def row(pool: asyncpg.Pool, server_id: str) -> Any:
    async with pool.acquire() as conn:
        return await instances.get(conn, UUID(server_id))


async def test_a_rebuild_records_the_new_image_and_fields_and_answers_the_server(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder, agents: StandInAgents
) -> None:
    server_id = await active_server(client, db_pool, agents, "rb-api-a")

    answer = await rebuild(
        client,
        server_id,
        {
            "imageRef": str(ALT_IMAGE),
            "name": "again",
            "metadata": {"role": "db"},
            "adminPass": "rebuildPassw0rd",
            "accessIPv4": "192.0.2.7",
        },
    )

    assert answer.status_code == 202, answer.text
    server = answer.json()["server"]
    assert (server["id"], server["name"], server["status"]) == (server_id, "again", "REBUILD")
    assert server["image"]["id"] == str(ALT_IMAGE)
    assert server["metadata"] == {"role": "db"}
    assert (server["adminPass"], server["accessIPv4"]) == ("rebuildPassw0rd", "192.0.2.7")
    assert "OS-EXT-STS:vm_state" not in server
    assert "key_name" not in server
    recorded = await row(db_pool, server_id)
    assert (recorded.vm_state, recorded.task_state) == ("active", "rebuild_spawning")
    assert recorded.image_ref == str(ALT_IMAGE)
    shown = await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert shown.json()["server"]["status"] == "REBUILD"
    again = await rebuild(client, server_id, {"imageRef": str(ALT_IMAGE)})
    assert again.status_code == 409, again.text
    assert "task_state rebuild_spawning" in again.json()["conflictingRequest"]["message"]


@pytest.mark.parametrize(
    ("version", "present", "absent"),
    [
        ("2.53", {"locked", "description", "tags"}, {"key_name", "user_data"}),
        ("2.54", {"key_name"}, {"user_data", "OS-EXT-STS:vm_state"}),
        ("2.57", {"key_name", "user_data"}, {"OS-EXT-STS:vm_state"}),
        ("2.74", {"locked_reason", "user_data"}, {"OS-EXT-AZ:availability_zone"}),
        ("2.75", {"OS-EXT-STS:vm_state", "user_data", "server_groups"}, set()),
        (
            "2.100",
            {"pinned_availability_zone", "scheduler_hints", "OS-EXT-SRV-ATTR:hostname"},
            set(),
        ),
    ],
)
async def test_the_answer_has_the_fields_of_its_microversion(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    agents: StandInAgents,
    *,
    version: str,
    present: set[str],
    absent: set[str],
) -> None:
    server_id = await active_server(client, db_pool, agents, f"rb-api-v{version}")

    answer = await rebuild(
        client, server_id, {"imageRef": str(ALT_IMAGE)}, headers=at(version, MEMBER)
    )

    assert answer.status_code == 202, answer.text
    fields = set(answer.json()["server"])
    assert present <= fields, present - fields
    assert not absent & fields, absent & fields
    assert "adminPass" in fields


@pytest.mark.parametrize(
    ("version", "value", "words"),
    [
        ("2.1", {}, "imageRef"),
        ("2.1", {"imageRef": str(ALT_IMAGE), "flavorRef": "1"}, "flavorRef"),
        ("2.1", {"imageRef": "not-an-image"}, "could not be found"),
        ("2.1", {"imageRef": str(ALT_IMAGE), "metadata": {"k": 1}}, "metadata"),
        ("2.1", {"imageRef": str(ALT_IMAGE), "preserve_ephemeral": True}, "ephemeral"),
        ("2.1", {"imageRef": str(ALT_IMAGE), "name": " padded "}, "whitespace"),
        ("2.18", {"imageRef": str(ALT_IMAGE), "description": "d"}, "description"),
        ("2.53", {"imageRef": str(ALT_IMAGE), "key_name": "k"}, "key_name"),
        ("2.54", {"imageRef": str(ALT_IMAGE), "key_name": "nobody-has-it"}, "key_name"),
        ("2.56", {"imageRef": str(ALT_IMAGE), "user_data": "aGk="}, "user_data"),
        ("2.57", {"imageRef": str(ALT_IMAGE), "user_data": "not base64!"}, "base64"),
        ("2.57", {"imageRef": str(ALT_IMAGE), "personality": []}, "personality"),
    ],
)
async def test_a_bad_body_is_a_400_and_changes_nothing(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    version: str,
    value: dict[str, Any],
    words: str,
) -> None:
    server_id = await active_server(client, db_pool, None, f"rb-api-bad-{abs(hash(words))}")
    before = await row(db_pool, server_id)

    answer = await rebuild(client, server_id, value, headers=at(version, MEMBER))

    assert answer.status_code == 400, answer.text
    assert words in answer.text
    after = await row(db_pool, server_id)
    assert (after.task_state, after.image_ref, after.display_name) == (
        None,
        before.image_ref,
        before.display_name,
    )


async def test_a_key_pair_and_user_data_are_set_or_removed(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agents: StandInAgents
) -> None:
    server_id = await active_server(client, db_pool, agents, "rb-api-key")
    made = await client.post(
        "/v2.1/os-keypairs", headers=at("2.10", MEMBER), json={"keypair": {"name": "k1"}}
    )
    assert made.status_code == 201, made.text

    answer = await rebuild(
        client,
        server_id,
        {"imageRef": str(ALT_IMAGE), "key_name": "k1", "user_data": "aGk="},
        headers=at("2.57", MEMBER),
    )

    assert answer.status_code == 202, answer.text
    assert (answer.json()["server"]["key_name"], answer.json()["server"]["user_data"]) == (
        "k1",
        "aGk=",
    )
    recorded = await row(db_pool, server_id)
    assert recorded.key_data == made.json()["keypair"]["public_key"]
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET task_state = NULL WHERE uuid = $1", UUID(server_id)
        )
    cleared = await rebuild(
        client,
        server_id,
        {"imageRef": str(ALT_IMAGE), "key_name": None, "user_data": None},
        headers=at("2.57", MEMBER),
    )
    assert cleared.status_code == 202, cleared.text
    recorded = await row(db_pool, server_id)
    assert (recorded.key_name, recorded.key_data, recorded.user_data) == (None, None, None)


async def test_refused_while_locked_building_or_its_host_is_down(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agents: StandInAgents
) -> None:
    server_id = await active_server(client, db_pool, agents, "rb-api-refused")
    body = {"imageRef": str(ALT_IMAGE)}

    locked = await client.post(
        f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={"lock": None}
    )
    assert locked.status_code == 202
    assert (await rebuild(client, server_id, body)).status_code == 409
    await client.post(f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={"unlock": None})

    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE services SET last_seen_up = now() - interval '1 hour' WHERE host = $1",
            "rb-api-refused",
        )
    down = await rebuild(client, server_id, body, headers=ADMIN)
    assert down.status_code == 409, down.text
    assert "is down" in down.text

    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'paused' WHERE uuid = $1", UUID(server_id)
        )
    paused = await rebuild(client, server_id, body, headers=ADMIN)
    assert paused.status_code == 409
    assert "vm_state paused" in paused.text
    assert (await row(db_pool, server_id)).image_ref != str(ALT_IMAGE)


class LosingCompute(ComputeAPI):
    """Every rebuild cast is lost, as a dropped connection loses it."""

    attempts = 0

    async def rebuild_guest(
        self, ctx: RequestContext, service_uuid: UUID, spec: InstanceSpec, *, powered_off: bool
    ) -> None:
        self.attempts += 1
        raise MessagingTimeout("the connection closed before the broker confirmed it")


@pytest.fixture
async def losing(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> AsyncIterator[tuple[httpx.AsyncClient, LosingCompute]]:
    compute = LosingCompute(transport)
    app = create_app(settings, db_pool, ConductorAPI(transport), compute)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http, compute


async def test_a_rebuild_that_cannot_be_sent_is_503_and_the_server_as_it_was(
    losing: tuple[httpx.AsyncClient, LosingCompute],
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(publish, "PAUSE", 0.01)
    client, compute = losing
    server_id = await active_server(client, db_pool, None, "rb-api-lost")
    before = await row(db_pool, server_id)

    answer = await rebuild(
        client, server_id, {"imageRef": str(ALT_IMAGE), "name": "lost", "metadata": {"a": "b"}}
    )

    assert answer.status_code == 503, answer.text
    assert compute.attempts == publish.ATTEMPTS
    after = await row(db_pool, server_id)
    assert (after.vm_state, after.task_state) == (VmState.ACTIVE, None)
    assert (after.image_ref, after.display_name, after.metadata) == (
        before.image_ref,
        before.display_name,
        before.metadata,
    )


class MarkedMeanwhileCompute(LosingCompute):
    """Every rebuild cast is lost, and while the first is on its way a delete marks the
    server ``deleting`` (over ``rebuild_spawning``) and records itself."""

    def __init__(self, transport: AmqpTransport, pool: asyncpg.Pool) -> None:
        super().__init__(transport)
        self.pool = pool

    async def rebuild_guest(
        self, ctx: RequestContext, service_uuid: UUID, spec: InstanceSpec, *, powered_off: bool
    ) -> None:
        if self.attempts == 0:
            async with self.pool.acquire() as conn, conn.transaction():
                await instances.mark_deleting(conn, spec.uuid)
                await instance_actions.start(
                    conn, RequestContext(user_id="other"), spec.uuid, "delete"
                )
        await super().rebuild_guest(ctx, service_uuid, spec, powered_off=powered_off)


async def test_a_rebuild_unsent_under_a_deletes_mark_is_503_and_its_fields_go_back(
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding 53: a rebuild whose every cast failed while a delete marked its server
    was answered 202 (its task gone, it looked taken), its new image and fields kept
    though nothing was sent. It is 503 now: the fields go back, the delete's mark stays."""
    monkeypatch.setattr(publish, "PAUSE", 0.01)
    compute = MarkedMeanwhileCompute(transport, db_pool)
    app = create_app(settings, db_pool, ConductorAPI(transport), compute)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as client:
        server_id = await active_server(client, db_pool, None, "rb-api-marked")
        before = await row(db_pool, server_id)

        answer = await rebuild(
            client, server_id, {"imageRef": str(ALT_IMAGE), "name": "lost", "metadata": {"a": "b"}}
        )

    assert answer.status_code == 503, answer.text
    after = await row(db_pool, server_id)
    assert (after.vm_state, after.task_state) == (VmState.ACTIVE, TaskState.DELETING)
    assert (after.image_ref, after.display_name, after.metadata) == (
        before.image_ref,
        before.display_name,
        before.metadata,
    )


class LosingRebuildsAndDeletes(LosingCompute):
    """Every rebuild and every delete cast is lost; ``lost[server]`` is set once the
    first rebuild cast of that server was."""

    def __init__(self, transport: AmqpTransport) -> None:
        super().__init__(transport)
        self.lost: dict[UUID, asyncio.Event] = {}

    async def rebuild_guest(
        self, ctx: RequestContext, service_uuid: UUID, spec: InstanceSpec, *, powered_off: bool
    ) -> None:
        self.lost.setdefault(spec.uuid, asyncio.Event()).set()
        await super().rebuild_guest(ctx, service_uuid, spec, powered_off=powered_off)

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        self.attempts += 1
        raise MessagingTimeout("the connection closed before the broker confirmed it")


@pytest.mark.parametrize("delete_first", [False, True], ids=["rebuild-first", "delete-first"])
async def test_a_rebuild_and_a_delete_both_unsent_at_once_leave_the_server_as_it_was(
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    monkeypatch: pytest.MonkeyPatch,
    delete_first: bool,
) -> None:
    """Finding 53's withdrawals run concurrently: a rebuild and a force-delete of one
    server, every cast of each lost. Rebuild first: the force-delete is sent once the
    rebuild's first cast was lost, marks the server over ``rebuild_spawning`` and is
    withdrawn while the rebuild's sending goes on; the rebuild, unsent under the mark,
    is 503 too. Delete first: both sent at once, the rebuild finds the delete's task
    (409) or comes after its withdrawal. Either way the server ends as it was: ACTIVE,
    no task, its image, name and metadata."""
    monkeypatch.setattr(publish, "PAUSE", 0.01)
    compute = LosingRebuildsAndDeletes(transport)
    app = create_app(settings, db_pool, ConductorAPI(transport), compute)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as client:
        server_id = await active_server(client, db_pool, None, f"rb-api-both-{delete_first}")
        async with db_pool.acquire() as conn:  # built: its create is over
            await instance_actions.finish(conn, UUID(server_id), "create")
        before = await row(db_pool, server_id)
        lost = compute.lost.setdefault(UUID(server_id), asyncio.Event())

        async def force_delete() -> httpx.Response:
            if not delete_first:
                await lost.wait()
            return await client.post(
                f"/v2.1/servers/{server_id}/action", headers=ADMIN, json={"forceDelete": None}
            )

        body = {"imageRef": str(ALT_IMAGE), "name": "lost", "metadata": {"a": "b"}}
        rebuilt, deleted = await asyncio.gather(rebuild(client, server_id, body), force_delete())

    assert deleted.status_code == 503, deleted.text
    assert rebuilt.status_code in ((409, 503) if delete_first else (503,)), rebuilt.text
    after = await row(db_pool, server_id)
    assert (after.vm_state, after.task_state, after.deleted_at) == (VmState.ACTIVE, None, None)
    assert (after.image_ref, after.display_name, after.metadata) == (
        before.image_ref,
        before.display_name,
        before.metadata,
    )


async def test_a_server_holding_no_claim_on_its_host_is_not_rebuilt(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agents: StandInAgents
) -> None:
    """Finding 26: a build that failed released the server's claim; a guest made there
    by a rebuild would run on resources nobody accounts for."""
    server_id = await active_server(client, db_pool, agents, "rb-api-unclaimed")
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'error' WHERE uuid = $1", UUID(server_id)
        )
        await conn.execute("DELETE FROM allocations WHERE consumer_uuid = $1", UUID(server_id))

    answer = await rebuild(client, server_id, {"imageRef": str(ALT_IMAGE)})

    assert answer.status_code == 409, answer.text
    assert "holds no claim on its host" in answer.text
    recorded = await row(db_pool, server_id)
    assert (recorded.vm_state, recorded.task_state) == ("error", None)
    assert recorded.image_ref != str(ALT_IMAGE)


async def test_from_2_90_a_rebuild_sets_the_host_name_and_admins_see_no_raw_user_data(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agents: StandInAgents
) -> None:
    server_id = await active_server(client, db_pool, agents, "rb-api-hostname")
    early = await rebuild(
        client, server_id, {"imageRef": str(ALT_IMAGE), "hostname": "db-1"}, headers=at("2.89")
    )
    assert early.status_code == 400, early.text

    answer = await rebuild(
        client,
        server_id,
        {"imageRef": str(ALT_IMAGE), "hostname": "db-1"},
        headers=at("2.90", ADMIN),
    )

    assert answer.status_code == 202, answer.text
    server = answer.json()["server"]
    assert server["OS-EXT-SRV-ATTR:hostname"] == "db-1"
    assert "OS-EXT-SRV-ATTR:user_data" not in server
    assert "user_data" in server
    assert (await row(db_pool, server_id)).hostname == "db-1"
