"""Host fences with real guests: an agent SIGKILLed never leaves two domains running.

Two agents on this machine's libvirtd, each with its host's ``keel-fence``; a short
lease (15 s) so that the tests take a minute, not several. The agent of the server's
host is SIGKILLed (its own process only: QEMU and the fence run on) and the server is
evacuated, the operator either waiting until keel-api lets it or forcing the host down
at once. ``virsh list`` is sampled every 0.5 s throughout: at no moment are two domains
of the server active. The source's domain ends off, and its fence says it fired.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from services.compute.virt.libvirt.domain import domain_uuid
from services.fence.api import FENCED_FILE
from tests.e2e.cloud import Cloud
from tests.e2e.moves import service_set, until_record, until_server
from tests.libvirt.cloud import HOSTS, libvirt_cloud
from tests.libvirt.cloud import agent_settings as cloud_settings
from tests.libvirt.guests import free_port
from tests.libvirt.test_cloud import console_shows, create, domain_state, node_uuid, uuid_of
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(600)

LEASE, MARGIN = 15.0, 2.0
SETTLE = 120.0


FORWARD_PORTS = {host: free_port() for host in HOSTS}


def agent_settings(host: str) -> dict[str, str]:
    return cloud_settings(host, FORWARD_PORTS)


@pytest.fixture(scope="module")
async def cloud(
    guest_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cloud]:
    workdir = tmp_path_factory.mktemp("libvirt-fence")
    async with libvirt_cloud(
        workdir, guest_images, FORWARD_PORTS, lease=LEASE, margin=MARGIN
    ) as running:
        yield running


def active_domains(uri: str) -> set[str]:
    """The UUIDs of the domains active on libvirtd now, as ``virsh list`` shows them."""
    done = subprocess.run(
        ["virsh", "-c", uri, "list", "--uuid"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {line.strip() for line in done.stdout.splitlines() if line.strip()}


@asynccontextmanager
async def sampled(cloud: Cloud, server_id: str, uri: str) -> AsyncIterator[list[int]]:
    """Every 0.5 s, how many of the server's domains are active (checked on the way out)."""
    ours = {str(domain_uuid(uuid_of(node_uuid(cloud, host)), uuid_of(server_id))) for host in HOSTS}
    counts: list[int] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            found = await asyncio.to_thread(active_domains, uri)
            counts.append(len(found & ours))
            await asyncio.sleep(0.5)

    task = asyncio.create_task(sample())
    try:
        yield counts
    finally:
        stop.set()
        await task
    assert counts, "nothing was sampled"
    assert max(counts) <= 1, f"two active domains in {sum(c > 1 for c in counts)} samples"


async def _evacuated(cloud: Cloud, server_id: str, destination: str) -> bool:
    """Ask for the evacuation; True once keel-api accepts it (400 while not fenced)."""
    async with cloud.http(cloud.admin_token) as http:
        response = await http.post(
            f"servers/{server_id}/action",
            json={"evacuate": {"host": destination}},
            headers={"OpenStack-API-Version": "compute 2.29"},
        )
    if response.status_code == 400:
        assert "still in use" in response.text or "not yet fenced" in response.text
        return False
    assert response.status_code == 200, response.text
    return True


@pytest.mark.parametrize("force_down", [False, True], ids=["waiting", "forced-down"])
async def test_a_killed_agents_guest_is_off_before_the_evacuated_one_boots(
    cloud: Cloud, libvirt_uri: str, force_down: bool
) -> None:
    source, destination = HOSTS if not force_down else tuple(reversed(HOSTS))
    sid = create(cloud, f"fenced-{force_down}", source)["id"]
    await console_shows(cloud, sid, 1)
    agent = cloud.processes[source]
    async with sampled(cloud, sid, libvirt_uri):
        agent.popen.kill()  # the agent only: QEMU and the host's fence run on
        agent.popen.wait()
        assert domain_state(cloud, source, sid, libvirt_uri) == "running"
        if force_down:
            service_set(cloud, source, "--down")
            assert await _evacuated(cloud, sid, destination)  # accepted, held for the lease
        else:
            await wait_until(
                lambda: _evacuated(cloud, sid, destination),
                what="the evacuation being accepted once the lease ran out",
                timeout=SETTLE,
            )
        moved = await until_server(cloud, sid, "ACTIVE")
        await until_record(cloud, sid, "done")
        await console_shows(cloud, sid, 1)
    assert moved["OS-EXT-SRV-ATTR:host"] == destination
    assert domain_state(cloud, destination, sid, libvirt_uri) == "running"
    assert domain_state(cloud, source, sid, libvirt_uri) == "off", "the old domain ends off"
    record = json.loads((cloud.state_dir(source) / FENCED_FILE).read_text())
    assert sid in record["powered_off"]
    assert "fenced: the lease ran out" in agent.read_log()

    # The source comes back: it removes the evacuated copy and is brought up again.
    cloud.start(source, "keel-compute", source, **agent_settings(source))
    await until_record(cloud, sid, "completed")
    service_set(cloud, source, "--up")
    await cloud.wait_for_service(source, up=True)
    assert domain_state(cloud, source, sid, libvirt_uri) is None
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)
