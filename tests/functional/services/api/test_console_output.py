"""``os-getConsoleOutput`` through keel-api to an agent on real RabbitMQ and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.manager import ComputeManager
from services.compute.rpcapi import ComputeAPI, topic_for
from services.compute.virt.fake import FakeDriver
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.db import instances
from shared.objects.service import Service
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    add_compute,
    add_image,
    place_on,
)
from tests.functional.services.api.test_servers import create
from tests.unit.services.compute.standin import make_spec

pytestmark = pytest.mark.functional


async def _serve_agent(
    transport: AmqpTransport, queues: list[str], service: Service, driver: FakeDriver
) -> RPCServer:
    manager = ComputeManager(driver, ConductorAPI(transport), node_uuid=uuid.uuid4())
    topic = topic_for(service.uuid)
    server = RPCServer(transport, topic, manager, version="1.4")
    queues.append(topic)
    await server.start()
    return server


@pytest.fixture
async def placed(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    transport: AmqpTransport,
    queues: list[str],
) -> AsyncIterator[tuple[str, FakeDriver]]:
    """A member's server placed on a live host whose agent holds its guest."""
    await add_image(db_pool)
    server_id = await create(client)
    service, node = await add_compute(db_pool, "cn1")
    await place_on(db_pool, server_id, node)
    driver = FakeDriver("cn1")
    spec = make_spec()
    await driver.spawn(spec.model_copy(update={"uuid": UUID(server_id)}))
    server = await _serve_agent(transport, queues, service, driver)
    yield server_id, driver
    await server.stop(1)


def _action(server_id: str) -> str:
    return f"/v2.1/servers/{server_id}/action"


async def test_console_output_and_its_last_lines(
    client: httpx.AsyncClient, placed: tuple[str, FakeDriver]
) -> None:
    server_id, driver = placed
    await driver.power_off(UUID(server_id))

    whole = await client.post(_action(server_id), headers=MEMBER, json={"os-getConsoleOutput": {}})
    last = await client.post(
        _action(server_id), headers=MEMBER, json={"os-getConsoleOutput": {"length": 3}}
    )
    as_text = await client.post(
        _action(server_id), headers=MEMBER, json={"os-getConsoleOutput": {"length": "2"}}
    )
    unlimited = await client.post(
        _action(server_id), headers=MEMBER, json={"os-getConsoleOutput": {"length": -1}}
    )

    assert whole.status_code == 200, whole.text
    output = whole.json()["output"]
    assert f"keel-guest-up {server_id}" in output
    assert output.rstrip("\n").endswith("powered off")
    assert len(last.json()["output"].split("\n")) == 3
    assert len(as_text.json()["output"].split("\n")) == 2
    assert unlimited.json()["output"] == output


@pytest.mark.parametrize(
    "value",
    [None, [], {"length": -2}, {"length": "ten"}, {"length": True}, {"length": 1.5}, {"tail": 1}],
)
async def test_bad_bodies_are_400(
    client: httpx.AsyncClient, placed: tuple[str, FakeDriver], value: object
) -> None:
    server_id, _ = placed

    answer = await client.post(
        _action(server_id), headers=MEMBER, json={"os-getConsoleOutput": value}
    )

    assert answer.status_code == 400, answer.text
    assert "badRequest" in answer.json()


async def test_other_projects_do_not_see_the_server(
    client: httpx.AsyncClient, placed: tuple[str, FakeDriver]
) -> None:
    server_id, _ = placed

    answer = await client.post(
        _action(server_id), headers=OTHER_MEMBER, json={"os-getConsoleOutput": {}}
    )

    assert answer.status_code == 404


async def test_a_server_without_a_host_is_409(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)

    answer = await client.post(_action(server_id), headers=MEMBER, json={"os-getConsoleOutput": {}})

    assert answer.status_code == 409
    assert "is not ready" in answer.json()["conflictingRequest"]["message"]


async def test_a_server_being_deleted_is_409(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, placed: tuple[str, FakeDriver]
) -> None:
    server_id, _ = placed
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET task_state = 'deleting' WHERE uuid = $1", UUID(server_id)
        )

    answer = await client.post(_action(server_id), headers=MEMBER, json={"os-getConsoleOutput": {}})

    assert answer.status_code == 409
    assert "task_state deleting" in answer.json()["conflictingRequest"]["message"]


async def test_a_host_that_is_down_is_409(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    _, node = await add_compute(db_pool, "cn-down", up=False)
    await place_on(db_pool, server_id, node)

    answer = await client.post(_action(server_id), headers=MEMBER, json={"os-getConsoleOutput": {}})

    assert answer.status_code == 409
    assert "is down" in answer.json()["conflictingRequest"]["message"]


async def test_a_guest_its_agent_does_not_have_is_404(
    client: httpx.AsyncClient, placed: tuple[str, FakeDriver]
) -> None:
    server_id, driver = placed
    await driver.destroy(UUID(server_id))

    answer = await client.post(_action(server_id), headers=MEMBER, json={"os-getConsoleOutput": {}})

    assert answer.status_code == 404
    assert "console not available" in answer.json()["itemNotFound"]["message"]


async def test_agents_too_old_to_be_asked_are_named_in_a_409(
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    placed: tuple[str, FakeDriver],
) -> None:
    server_id, _ = placed
    app = create_app(
        settings, db_pool, ConductorAPI(transport), ComputeAPI(transport, version_cap="1.3")
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as old:
        answer = await old.post(
            _action(server_id), headers=ADMIN, json={"os-getConsoleOutput": {"length": 5}}
        )

    assert answer.status_code == 409
    message = answer.json()["conflictingRequest"]["message"]
    assert "cn1 (release arbor)" in message
    assert "compute RPC 1.4" in message
    async with db_pool.acquire() as conn:
        assert (await instances.find(conn, UUID(server_id))) is not None
