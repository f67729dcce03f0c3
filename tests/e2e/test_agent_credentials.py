"""An agent with its own RabbitMQ user, made by ``keel-manage agent credentials``.

Real processes, the real CLI. The agent of host ``ac-own`` connects as its own broker user;
``ac-shared`` as the control plane's. With those narrow permissions the agent does all an
agent does (register, heartbeats, build, stop and start, cold migration from and to it,
delete); the same valid credentials get it nowhere with the other host's server, neither
through the conductor nor straight to the other agent's queue; they survive an operator
rename, and cannot start an agent under another host name.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from yarl import URL

from services.compute.rpcapi import TerminateInstance
from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.rpc.amqp import AmqpTransport
from shared.rpc.amqp_topology import Topology
from shared.rpc.envelope import CONTENT_TYPE, Envelope
from tests.e2e.cloud import Cloud, CloudConfig
from tests.e2e.moves import claimed_on, until_record, until_server
from tests.e2e.test_requested_destination import create
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

OWN, SHARED = "ac-own", "ac-shared"
SETTLE = 60.0


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=(SHARED,))


@pytest.fixture(scope="module")
async def own_url(cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """Credentials for ``ac-own``, and its agent running with them."""
    env_file = tmp_path_factory.mktemp("agent") / "ac-own.env"
    made = cloud.manage("agent", "credentials", OWN, "--env-file", str(env_file))
    assert made.returncode == 0, made.stderr
    url = env_file.read_text().strip().partition("=")[2]
    cloud.start(OWN, "keel-compute", OWN, KEEL_TRANSPORT_URL=url)
    try:
        await cloud.wait_for_service(OWN, up=True)
        yield url
    finally:
        for name in [n for n in cloud.processes if n.startswith(OWN)]:
            cloud.processes[name].stop()
        for host in (OWN, f"{OWN}-renamed"):
            cloud.manage("agent", "revoke", host)


def log_of(cloud: Cloud, name: str) -> str:
    return cloud.processes[name].log.read_text(encoding="utf-8", errors="replace")


async def logged(cloud: Cloud, name: str, text: str) -> None:
    async def found() -> bool:
        return text in log_of(cloud, name)

    await wait_until(found, what=f"{text!r} in the log of {name}", timeout=SETTLE)


def action(cloud: Cloud, *args: str) -> None:
    cloud.openstack("--os-compute-api-version", "2.56", *args, as_json=False)


async def test_an_agent_on_its_own_user_does_all_an_agent_does(cloud: Cloud, own_url: str) -> None:
    server = await create(cloud, "ac-everything", "--host", OWN)
    sid = server["id"]
    assert (server["status"], server["OS-EXT-SRV-ATTR:host"]) == ("ACTIVE", OWN)
    action(cloud, "server", "stop", sid)
    await until_server(cloud, sid, "SHUTOFF")
    action(cloud, "server", "start", sid)
    await until_server(cloud, sid, "ACTIVE")
    # Away from it (it is the source, removing its copy on confirm)...
    action(cloud, "server", "migrate", "--host", SHARED, sid)
    await until_server(cloud, sid, "VERIFY_RESIZE")
    action(cloud, "server", "resize", "confirm", sid)
    await until_record(cloud, sid, "confirmed")
    assert (await until_server(cloud, sid, "ACTIVE"))["OS-EXT-SRV-ATTR:host"] == SHARED
    # ...and back to it (it is the destination, reporting the move).
    action(cloud, "server", "migrate", "--host", OWN, sid)
    await until_server(cloud, sid, "VERIFY_RESIZE")
    action(cloud, "server", "resize", "confirm", sid)
    await until_record(cloud, sid, "confirmed")
    assert (await until_server(cloud, sid, "ACTIVE"))["OS-EXT-SRV-ATTR:host"] == OWN
    assert await claimed_on(cloud, sid) == [OWN]
    await cloud.delete_server(sid)
    assert not (cloud.state_dir(OWN) / "instances" / sid).exists()
    assert "refused" not in log_of(cloud, "conductor")


async def test_its_valid_credentials_get_it_nowhere_with_another_hosts_server(
    cloud: Cloud, own_url: str
) -> None:
    server = await create(cloud, "ac-theirs", "--host", SHARED)
    sid = server["id"]
    user = URL(own_url).user
    transport = AmqpTransport(own_url, cloud.exchange, connect_timeout=10)
    await transport.connect()
    try:
        # Through the conductor: a forged report that the server was deleted.
        await ConductorAPI(transport).instance_deleted(RequestContext.internal(), uuid.UUID(sid))
        await logged(cloud, "conductor", f"refused instance_deleted from broker user {user}")
        # Straight to the other agent's queue, through the default exchange.
        async with cloud.pool.acquire() as conn:
            shared_service = await conn.fetchval(
                "SELECT uuid FROM services WHERE host = $1 AND deleted_at IS NULL", SHARED
            )
        forged = Envelope(
            method="terminate_instance",
            version="1.0",
            context=RequestContext.internal(),
            args=TerminateInstance(instance_uuid=uuid.UUID(sid)).model_dump(mode="json"),
        )
        connection = await aio_pika.connect(own_url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.default_exchange.publish(
                aio_pika.Message(
                    forged.model_dump_json().encode(), content_type=CONTENT_TYPE, user_id=user
                ),
                routing_key=Topology(cloud.exchange).queue_name(f"compute.{shared_service}"),
            )
        await logged(cloud, SHARED, f"refused terminate_instance from broker user {user}")
    finally:
        await transport.close()
    await asyncio.sleep(1)
    shown = (await cloud.get(f"servers/{sid}"))["server"]
    assert (shown["status"], shown["OS-EXT-SRV-ATTR:host"]) == ("ACTIVE", SHARED)
    assert (cloud.state_dir(SHARED) / "instances" / sid).is_dir()
    await cloud.delete_server(sid)


async def test_credentials_survive_a_rename_and_name_one_host(cloud: Cloud, own_url: str) -> None:
    renamed = f"{OWN}-renamed"
    cloud.processes[OWN].stop()
    await cloud.wait_for_service(OWN, up=False)
    done = cloud.manage("service", "rename", OWN, renamed)
    assert done.returncode == 0, done.stderr
    # Under another name than its service's, the agent is refused and changes nothing.
    code, log = await asyncio.to_thread(
        cloud.run_agent,
        "ac-impostor",
        cloud.state_dir(OWN),
        timeout=SETTLE,
        env={"KEEL_TRANSPORT_URL": own_url},
    )
    assert code == 1, log
    assert "not to host 'ac-impostor'" in log
    assert "Traceback" not in log
    # Under the new name, with the same credentials and state, it is back.
    cloud.start(f"{OWN}-2", "keel-compute", renamed, KEEL_TRANSPORT_URL=own_url,
                KEEL_STATE_DIR=str(cloud.state_dir(OWN)))  # fmt: skip
    await cloud.wait_for_service(renamed, up=True)
    server: dict[str, Any] = await create(cloud, "ac-renamed", "--host", renamed)
    assert server["status"] == "ACTIVE"
    await cloud.delete_server(server["id"])


def test_the_env_file_is_private(cloud: Cloud, tmp_path: Path) -> None:
    env_file = tmp_path / "x.env"
    made = cloud.manage("agent", "credentials", "ac-later", "--env-file", str(env_file))
    try:
        assert made.returncode == 0, made.stderr
        assert env_file.stat().st_mode & 0o077 == 0
        password = URL(env_file.read_text().strip().partition("=")[2]).password
        assert password is not None
        assert password not in made.stdout
    finally:
        cloud.manage("agent", "revoke", "ac-later")
