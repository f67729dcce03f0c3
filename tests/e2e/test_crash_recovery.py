"""Processes killed with SIGKILL half-way through a build, a shelve's offload or an
unshelve: the cloud converges by itself.

Real processes, real RabbitMQ and PostgreSQL. A process armed with ``KEEL_FAULT_INJECT``
kills itself at a named point of the workflow, as a power cut would. Whatever it held
goes back to its queue; what it wrote stays. Afterwards every instance is ACTIVE, or in
ERROR by the build deadline, with exactly the claims it should hold, and every node's
usage equals the sum of its allocations.
"""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any
from uuid import UUID

import pytest

from shared.db import allocations, instances
from tests.e2e.cloud import CIRROS_ID, Cloud, CloudConfig, Process
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

#: Seconds a build may take before the conductor puts it in ERROR (short, for the test).
BUILD_TIMEOUT = 15
SETTLE = 60.0


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=("compute1",), env=(("KEEL_BUILD_TIMEOUT", str(BUILD_TIMEOUT)),))


async def create(cloud: Cloud, name: str) -> UUID:
    async with cloud.http(cloud.admin_token) as client:
        body = {"server": {"name": name, "imageRef": str(CIRROS_ID), "flavorRef": "1"}}
        response = await client.post("servers", json=body)
    assert response.status_code == 202, response.text
    return UUID(response.json()["server"]["id"])


async def show(cloud: Cloud, server_id: UUID) -> dict[str, Any] | None:
    async with cloud.http(cloud.admin_token) as client:
        response = await client.get(f"servers/{server_id}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    server: dict[str, Any] = response.json()["server"]
    return server


async def reaches(cloud: Cloud, server_id: UUID, status: str | None) -> dict[str, Any] | None:
    """The server once its status is ``status`` (``None``: once it is gone)."""
    found: list[dict[str, Any] | None] = []

    async def check() -> bool:
        server = await show(cloud, server_id)
        found[:] = [server]
        return (server is None) if status is None else (server or {}).get("status") == status

    await wait_until(check, what=f"server {server_id} reaching {status}", timeout=SETTLE)
    return found[0]


async def killed(process: Process) -> None:
    async def dead() -> bool:
        return process.popen.poll() is not None

    await wait_until(dead, what=f"{process.name} dying at its fault point", timeout=SETTLE)
    assert process.popen.returncode == -signal.SIGKILL, process.tail()
    assert "fault injection: reached" in process.tail()


async def up(cloud: Cloud, binary: str, host: str) -> None:
    async def check() -> bool:
        async with cloud.pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    """SELECT last_seen_up > now() - interval '2 seconds' FROM services
                        WHERE host = $1 AND "binary" = $2 AND deleted_at IS NULL""",
                    host,
                    binary,
                )
            )

    await wait_until(check, what=f"{binary} on {host} reporting up", timeout=SETTLE)


async def claims_of(cloud: Cloud, server_id: UUID) -> int:
    async with cloud.pool.acquire() as conn:
        return len(await allocations.for_instance(conn, server_id))


async def balanced(cloud: Cloud) -> None:
    async with cloud.pool.acquire() as conn:
        assert await allocations.usage_drift(conn) == []


def replace(cloud: Cloud, name: str, binary: str, host: str, **env: str) -> Process:
    """Stop ``name`` cleanly (if running) and start it again with ``env``."""
    cloud.processes[name].stop()
    return cloud.start(name, binary, host, **env)


@pytest.mark.parametrize(
    "point", ["conductor.build.after_claim", "conductor.build.after_placement"]
)
async def test_conductor_killed_mid_build_another_finishes_it_once(
    cloud: Cloud, point: str
) -> None:
    doomed = replace(cloud, "conductor", "keel-conductor", "controller", KEEL_FAULT_INJECT=point)
    await up(cloud, "keel-conductor", "controller")
    server_id = await create(cloud, f"crash-{point.rsplit('.', 1)[-1]}")

    await killed(doomed)
    cloud.start("conductor", "keel-conductor", "controller")

    server = await reaches(cloud, server_id, "ACTIVE")
    assert server is not None
    assert server["OS-EXT-SRV-ATTR:host"] == "compute1"
    assert await claims_of(cloud, server_id) == 1
    guest = cloud.state_dir("compute1") / "instances" / str(server_id)
    assert guest.is_dir()
    await balanced(cloud)


async def test_scheduler_killed_after_its_claim_leaves_one_claim(cloud: Cloud) -> None:
    doomed = replace(
        cloud,
        "scheduler1",
        "keel-scheduler",
        "controller",
        KEEL_FAULT_INJECT="scheduler.select.after_claim",
    )
    await up(cloud, "keel-scheduler", "controller")
    server_id = await create(cloud, "scheduler-crash")
    await killed(doomed)
    # The conductor's call times out; it tries again, and the next scheduler hands it
    # the claim the dead one made.
    cloud.start("scheduler1", "keel-scheduler", "controller")

    await reaches(cloud, server_id, "ACTIVE")
    assert await claims_of(cloud, server_id) == 1
    await balanced(cloud)


async def test_agent_killed_after_its_host_was_claimed_ends_in_error_by_the_deadline(
    cloud: Cloud,
) -> None:
    doomed = replace(
        cloud,
        "compute1",
        "keel-compute",
        "compute1",
        KEEL_FAULT_INJECT="compute.build.before_spawn",
    )
    await up(cloud, "keel-compute", "compute1")
    server_id = await create(cloud, "agent-crash")
    await killed(doomed)

    server = await reaches(cloud, server_id, "ERROR")
    assert server is not None
    assert f"did not finish within {BUILD_TIMEOUT} seconds" in server["fault"]["message"]
    assert await claims_of(cloud, server_id) == 0
    await balanced(cloud)

    # Back without the fault, the agent takes the build it was killed on, learns it was
    # given up, and builds nothing.
    agent = cloud.start("compute1", "keel-compute", "compute1")
    await up(cloud, "keel-compute", "compute1")

    async def answered() -> bool:
        return f"not building guest {server_id}" in agent.tail(400)

    await wait_until(answered, what="the agent declining the stale build", timeout=SETTLE)
    assert not (cloud.state_dir("compute1") / "instances" / str(server_id)).exists()


async def test_delete_that_arrives_before_the_guest_is_built_leaves_no_guest(
    cloud: Cloud,
) -> None:
    doomed = replace(
        cloud,
        "compute1",
        "keel-compute",
        "compute1",
        KEEL_FAULT_INJECT="compute.build.before_spawn",
    )
    await up(cloud, "keel-compute", "compute1")
    server_id = await create(cloud, "deleted-early")
    await killed(doomed)

    async with cloud.http(cloud.admin_token) as client:
        assert (await client.delete(f"servers/{server_id}")).status_code == 204
    agent = cloud.start("compute1", "keel-compute", "compute1")

    await reaches(cloud, server_id, None)

    async def answered() -> bool:
        return f"not building guest {server_id}" in agent.tail(400)

    await wait_until(answered, what="the agent declining the deleted build", timeout=SETTLE)
    assert not (cloud.state_dir("compute1") / "instances" / str(server_id)).exists()
    async with cloud.pool.acquire() as conn:
        instance = await instances.find(conn, server_id)
    assert instance is not None
    assert instance.deleted_at is not None
    assert await claims_of(cloud, server_id) == 0
    await balanced(cloud)


def test_topic_queues_are_quorum_queues_with_a_delivery_limit(cloud: Cloud) -> None:
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "type", "arguments", "--formatter", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    mine = {
        queue["name"].removeprefix(cloud.exchange + "."): queue
        for queue in json.loads(listed.stdout)
        if queue["name"].startswith(cloud.exchange + ".")
    }
    topics = [name for name in mine if name in ("conductor", "scheduler")]
    topics += [name for name in mine if name.startswith("compute.")]
    assert {"conductor", "scheduler"} <= set(topics)
    assert any(name.startswith("compute.") for name in topics)
    for name in topics:
        arguments = {key: value for key, _type, value in mine[name]["arguments"]}
        assert mine[name]["type"] == "quorum", name
        assert arguments["x-delivery-limit"] == 5, name
        assert arguments["x-dead-letter-exchange"] == f"{cloud.exchange}.dead", name


async def act(cloud: Cloud, server_id: UUID, body: dict[str, Any]) -> None:
    async with cloud.http(cloud.admin_token) as client:
        response = await client.post(f"servers/{server_id}/action", json=body)
    assert response.status_code == 202, response.text


@pytest.mark.parametrize(
    "point", ["conductor.shelve.offload_begun", "conductor.unshelve.after_placement"]
)
async def test_conductor_killed_mid_shelve_another_carries_it_on(cloud: Cloud, point: str) -> None:
    """Killed once the offload is recorded (the guest not yet destroyed), or once the
    unshelve's host is claimed and recorded (the build not sent): the message goes back
    to the queue and the next conductor carries it on, once."""
    server_id = await create(cloud, f"shelf-{point.split('.')[1]}")
    await reaches(cloud, server_id, "ACTIVE")
    guest = cloud.state_dir("compute1") / "instances" / str(server_id)
    doomed = replace(cloud, "conductor", "keel-conductor", "controller", KEEL_FAULT_INJECT=point)
    await up(cloud, "keel-conductor", "controller")

    await act(cloud, server_id, {"shelve": None})
    if point == "conductor.shelve.offload_begun":
        await killed(doomed)
        cloud.start("conductor", "keel-conductor", "controller")
    offloaded = await reaches(cloud, server_id, "SHELVED_OFFLOADED")
    assert offloaded is not None
    assert offloaded["OS-EXT-SRV-ATTR:host"] is None
    assert await claims_of(cloud, server_id) == 0
    assert not guest.exists()
    await act(cloud, server_id, {"unshelve": None})
    if point == "conductor.unshelve.after_placement":
        await killed(doomed)
        cloud.start("conductor", "keel-conductor", "controller")

    server = await reaches(cloud, server_id, "ACTIVE")
    assert server is not None
    assert server["OS-EXT-SRV-ATTR:host"] == "compute1"
    assert await claims_of(cloud, server_id) == 1
    assert guest.is_dir()
    await balanced(cloud)
    async with cloud.http(cloud.admin_token) as client:
        assert (await client.delete(f"servers/{server_id}")).status_code == 204
    await reaches(cloud, server_id, None)  # the module's one host has room for the next
