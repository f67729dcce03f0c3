"""Operating compute hosts of a running cloud: old rows, hypervisor renames, host renames,
service deletes — with real agents, the real openstack client and keel-manage.

Guests are directories in an agent's state directory, and only the agent removes them:
a guest directory that disappears after a delete proves the delete reached the agent
through its queue, ``compute.<service uuid>``.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.cloud import Cloud
from tests.polling import wait_until

pytestmark = pytest.mark.e2e


def guest_dir(state_dir: Path, server: dict[str, Any]) -> Path:
    return state_dir / "instances" / str(server["id"])


async def compute_services(cloud: Cloud) -> dict[str, dict[str, Any]]:
    listed = await cloud.get("os-services?binary=keel-compute")
    return {s["host"]: s for s in listed["services"]}


async def delete_service(cloud: Cloud, service_id: str) -> httpx.Response:
    async with cloud.http(cloud.admin_token) as http:
        return await http.delete(
            f"os-services/{service_id}", headers={"OpenStack-API-Version": "compute 2.53"}
        )


async def test_a_row_written_without_compute_id_is_deleted_through_its_agent(
    cloud: Cloud,
) -> None:
    server = await cloud.create_server("old-row")
    host = server["OS-EXT-SRV-ATTR:host"]
    guest = guest_dir(cloud.state_dir(host), server)
    assert guest.is_dir()
    async with cloud.pool.acquire() as conn:
        await conn.execute("UPDATE instances SET compute_id = NULL WHERE uuid = $1", server["id"])

    await cloud.delete_server(server["id"])

    assert not guest.exists()
    assert f"instance {server['id']} has no compute node id" in cloud.logs()["api"]


async def test_hypervisor_host_name_change_is_tolerated(cloud: Cloud) -> None:
    server = await cloud.create_server("on-renamed-hypervisor")
    host = server["OS-EXT-SRV-ATTR:host"]
    node_uuid = (cloud.state_dir(host) / "compute_id").read_text().strip()
    assert cloud.processes[host].stop() == 0

    agent = cloud.start_agent(
        host, host, cloud.state_dir(host), KEEL_COMPUTE__HYPERVISOR_HOSTNAME=f"{host}.renamed"
    )
    await cloud.wait_for_service(host, up=True)
    await asyncio.sleep(cloud.config.service_down_time / 2)  # a few heartbeats later

    assert agent.popen.poll() is None
    names = {h["Hypervisor Hostname"] for h in cloud.openstack("hypervisor", "list")}
    assert f"{host}.renamed" in names
    assert host not in names
    shown = (await cloud.get(f"os-hypervisors/{node_uuid}"))["hypervisor"]
    assert (shown["id"], shown["hypervisor_hostname"]) == (node_uuid, f"{host}.renamed")
    assert f"{host!r} → '{host}.renamed'" in cloud.logs()["conductor"]
    moved = (await cloud.get(f"servers/{server['id']}"))["server"]
    assert moved["OS-EXT-SRV-ATTR:hypervisor_hostname"] == f"{host}.renamed"

    cloud.openstack("server", "stop", server["id"], as_json=False)
    await _status(cloud, server["id"], "SHUTOFF")
    cloud.openstack("server", "start", server["id"], as_json=False)
    await _status(cloud, server["id"], "ACTIVE")
    await cloud.delete_server(server["id"])
    assert not guest_dir(cloud.state_dir(host), server).exists()


async def test_renamed_host_keeps_its_node_servers_and_queue(cloud: Cloud, tmp_path: Path) -> None:
    cloud.start_agent("rename-a", "rename-a", tmp_path, KEEL_COMPUTE__AVAILABILITY_ZONE="zone-a")
    await cloud.wait_for_service("rename-a", up=True)
    servers = [await cloud.create_server(f"renamed-{i}", "zone-a") for i in range(2)]
    assert {s["OS-EXT-SRV-ATTR:host"] for s in servers} == {"rename-a"}
    node_uuid = (tmp_path / "compute_id").read_text().strip()
    service_id = (await compute_services(cloud))["rename-a"]["id"]

    while_up = cloud.manage("service", "rename", "rename-a", "rename-b")
    assert while_up.returncode == 1
    assert "is up" in while_up.stderr
    assert cloud.processes["rename-a"].stop() == 0
    await cloud.wait_for_service("rename-a", up=False)
    renamed = cloud.manage("service", "rename", "rename-a", "rename-b")
    assert renamed.returncode == 0, renamed.stderr

    cloud.start_agent("rename-b", "rename-b", tmp_path, KEEL_COMPUTE__AVAILABILITY_ZONE="zone-a")
    await cloud.wait_for_service("rename-b", up=True)

    listed = await compute_services(cloud)
    assert "rename-a" not in listed
    assert listed["rename-b"]["id"] == service_id
    assert (tmp_path / "compute_id").read_text().strip() == node_uuid
    hypervisor = (await cloud.get(f"os-hypervisors/{node_uuid}"))["hypervisor"]
    assert hypervisor["service"]["host"] == "rename-b"
    for server in servers:
        shown = (await cloud.get(f"servers/{server['id']}"))["server"]
        assert shown["OS-EXT-SRV-ATTR:host"] == "rename-b"
    for server in servers:
        await cloud.delete_server(server["id"])
        assert not guest_dir(tmp_path, server).exists()
    assert cloud.processes["rename-b"].stop() == 0


async def test_service_delete_refused_with_servers_then_done(cloud: Cloud, tmp_path: Path) -> None:
    cloud.start_agent("doomed", "doomed", tmp_path, KEEL_COMPUTE__AVAILABILITY_ZONE="zone-d")
    await cloud.wait_for_service("doomed", up=True)
    server = await cloud.create_server("on-doomed", "zone-d")
    service_id = (await compute_services(cloud))["doomed"]["id"]
    node_uuid = (tmp_path / "compute_id").read_text().strip()

    up = await delete_service(cloud, service_id)
    assert up.status_code == 409
    assert "is up" in up.json()["conflictingRequest"]["message"]
    assert cloud.processes["doomed"].stop() == 0
    await cloud.wait_for_service("doomed", up=False)
    hosting = await delete_service(cloud, service_id)
    assert hosting.status_code == 409
    assert "hosting instances" in hosting.json()["conflictingRequest"]["message"]

    await cloud.delete_server(server["id"])
    cloud.openstack("compute", "service", "delete", service_id, as_json=False)

    assert "doomed" not in await compute_services(cloud)
    hypervisors = (await cloud.get("os-hypervisors"))["hypervisors"]
    assert node_uuid not in {h["id"] for h in hypervisors}
    code, log = cloud.run_agent("doomed", tmp_path)
    assert code == 1, log
    assert f"compute node {node_uuid} (host 'doomed') was deleted" in log

    (tmp_path / "compute_id").unlink()
    # The server was deleted while its agent was down: its guest is still on the host,
    # and a new node does not start beside guests it cannot account for.
    code, log = cloud.run_agent("doomed", tmp_path)
    assert code == 1, log
    assert "a new service whose hypervisor already holds instances" in log
    assert server["id"] in log
    shutil.rmtree(tmp_path / "instances" / server["id"])
    cloud.start_agent("doomed-again", "doomed", tmp_path)
    await cloud.wait_for_service("doomed", up=True)
    fresh = (tmp_path / "compute_id").read_text().strip()
    assert uuid.UUID(fresh) != uuid.UUID(node_uuid)
    assert cloud.processes["doomed-again"].stop() == 0


async def _status(cloud: Cloud, server_id: str, status: str) -> None:
    async def reached() -> bool:
        return bool((await cloud.get(f"servers/{server_id}"))["server"]["status"] == status)

    await wait_until(reached, what=f"server {server_id} reaching {status}", timeout=60)
