"""What the tests of moves share: placing a server on a host, its guest directories,
its status and migration records, the claims it holds, and the CLI calls that move it.

Guests of the local driver are directories under each agent's state directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.db import allocations
from tests.e2e.cloud import Cloud
from tests.polling import wait_until

#: Seconds a move's step may take.
SETTLE = 60.0


def guest(cloud: Cloud, host: str, server_id: str) -> Path:
    """Where ``host``'s agent keeps the server's guest."""
    return cloud.state_dir(host) / "instances" / server_id


def service_set(cloud: Cloud, host: str, *flags: str) -> None:
    """``openstack compute service set FLAGS HOST keel-compute``."""
    cloud.openstack("compute", "service", "set", *flags, host, "keel-compute", as_json=False)


async def on(cloud: Cloud, host: str, name: str) -> dict[str, Any]:
    """A new ACTIVE server requested on ``host`` (microversion 2.74).

    On a starved machine the host may look down at the moment the server is scheduled
    (a heartbeat unanswered past the e2e cloud's short down time): a server that found
    no valid host is deleted and asked for once more, once the host is seen up again.
    """
    try:
        server = await cloud.create_server(name, host=host)
    except AssertionError as exc:
        failed = exc.args[0] if exc.args else None
        if not isinstance(failed, dict) or "No valid host" not in str(failed.get("fault")):
            raise
        await cloud.delete_server(failed["id"])
        await cloud.wait_for_service(host, up=True)
        server = await cloud.create_server(name, host=host)
    assert server["OS-EXT-SRV-ATTR:host"] == host
    return server


async def shown(cloud: Cloud, server_id: str) -> dict[str, Any]:
    """The server as the admin sees it."""
    server: dict[str, Any] = (await cloud.get(f"servers/{server_id}"))["server"]
    return server


async def until_server(cloud: Cloud, server_id: str, status: str) -> dict[str, Any]:
    """The server, once its status is ``status``."""

    async def check() -> bool:
        return bool((await shown(cloud, server_id))["status"] == status)

    await wait_until(check, what=f"server {server_id} reaching {status}", timeout=SETTLE)
    return await shown(cloud, server_id)


async def migrations_of(cloud: Cloud, server_id: str) -> list[dict[str, Any]]:
    """The server's migration records, newest first."""
    found = await cloud.get(f"os-migrations?instance_uuid={server_id}", version="2.59")
    migrations: list[dict[str, Any]] = found["migrations"]
    return migrations


async def latest_record(cloud: Cloud, server_id: str) -> dict[str, Any]:
    """The server's newest migration record."""
    return (await migrations_of(cloud, server_id))[0]


async def until_record(cloud: Cloud, server_id: str, status: str) -> dict[str, Any]:
    """The server's newest migration record, once its status is ``status``."""

    async def check() -> bool:
        records = await migrations_of(cloud, server_id)
        return bool(records and records[0]["status"] == status)

    await wait_until(check, what=f"move of {server_id} reaching {status}", timeout=SETTLE)
    return await latest_record(cloud, server_id)


async def claimed_on(cloud: Cloud, server_id: str) -> list[str]:
    """The hosts holding a claim for the server; every node's usage must add up."""
    async with cloud.pool.acquire() as conn:
        hosts = await conn.fetch(
            """SELECT n.host FROM allocations a JOIN compute_nodes n ON n.id = a.compute_node_id
                WHERE a.instance_uuid = $1::uuid ORDER BY n.host""",
            server_id,
        )
        assert await allocations.usage_drift(conn) == []
    return [row["host"] for row in hosts]


def migrate(cloud: Cloud, server_id: str, *host: str) -> None:
    """``openstack server migrate`` at 2.56, to ``host`` if given."""
    args = ["--host", host[0]] if host else []
    cloud.openstack(
        "--os-compute-api-version", "2.56", "server", "migrate", *args, server_id, as_json=False
    )


def evacuate(cloud: Cloud, server_id: str, *host: str) -> None:
    """``openstack server evacuate`` at 2.29, to ``host`` if given."""
    args = ["--host", host[0]] if host else []
    cloud.openstack(
        "--os-compute-api-version", "2.29", "server", "evacuate", *args, server_id, as_json=False
    )
