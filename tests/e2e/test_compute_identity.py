"""Real keel-compute processes starting with good, missing, wrong and copied identities.

Each refused start exits 1 with a message that says what happened and what to do, and
leaves services, compute_nodes, instances and allocations exactly as they were. The
cloud's two agents are stopped before the refusals, so nothing else writes those rows
(the control services' own heartbeats are left out of the dump).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.versions import STABLE_IDENTITY_VERSION
from tests.e2e.cloud import Cloud

pytestmark = pytest.mark.e2e


def node_of(cloud: Cloud, host: str) -> str:
    return (cloud.state_dir(host) / "compute_id").read_text().strip()


async def test_greenfield_identity_is_the_hypervisor_id_and_survives_a_restart(
    cloud: Cloud,
) -> None:
    path = cloud.state_dir("compute1") / "compute_id"
    raw = path.read_bytes()
    node_uuid = str(uuid.UUID(raw.decode().strip()))
    assert raw == f"{node_uuid}\n".encode()

    shown = cloud.openstack("hypervisor", "show", node_uuid)
    assert shown["id"] == node_uuid
    assert shown["hypervisor_hostname"] == "compute1"

    assert cloud.processes["compute1"].stop() == 0
    cloud.start_agent("compute1", "compute1", cloud.state_dir("compute1"))
    await cloud.wait_for_service("compute1", up=True)
    assert path.read_bytes() == raw
    assert len(cloud.openstack("hypervisor", "list")) == 2


async def test_identity_only_beside_the_config_file_names_the_new_node(
    cloud: Cloud, tmp_path: Path
) -> None:
    provisioned = str(uuid.uuid4())
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "keel.toml").write_text("# settings come from the environment\n")
    (etc / "compute_id").write_text(f"{provisioned}\n")

    agent = cloud.start_agent(
        "provisioned", "provisioned", tmp_path / "state", "--config", str(etc / "keel.toml")
    )
    await cloud.wait_for_service("provisioned", up=True)

    shown = (await cloud.get(f"os-hypervisors/{provisioned}"))["hypervisor"]
    assert shown["service"]["host"] == "provisioned"
    assert not (tmp_path / "state" / "compute_id").exists()
    assert agent.stop() == 0
    # Stopped, it would still count as up for a while and could be chosen for the next
    # module fixture's server, which would then wait for an agent that never comes.
    cloud.openstack(
        "--os-compute-api-version", "2.11", "compute", "service", "set", "--down",
        "provisioned", "keel-compute", as_json=False,
    )  # fmt: skip


@dataclass(frozen=True)
class Quiet:
    """The cloud with a server on ``busy`` and none on ``idle``, every agent stopped."""

    cloud: Cloud
    busy: str
    idle: str
    server: str


@pytest.fixture(scope="module")
async def quiet(cloud: Cloud) -> Quiet:
    server = await cloud.create_server("kept")
    busy = server["OS-EXT-SRV-ATTR:host"]
    idle = next(h for h in cloud.config.computes if h != busy)
    for host in cloud.config.computes:
        assert cloud.processes[host].stop() == 0
    return Quiet(cloud, busy, idle, server["id"])


async def refused(quiet: Quiet, host: str, state_dir: Path, *args: str, **settings: str) -> str:
    """Start an agent that must be refused; its log. The database must not change."""
    before = await quiet.cloud.dump()
    code, log = quiet.cloud.run_agent(host, state_dir, *args, env=settings)
    assert code == 1, log
    assert await quiet.cloud.dump() == before
    assert "keel-compute cannot run" in log
    return log


def copy_identity(quiet: Quiet, host: str, to: Path) -> str:
    to.mkdir(parents=True, exist_ok=True)
    node_uuid = node_of(quiet.cloud, host)
    (to / "compute_id").write_text(f"{node_uuid}\n")
    return node_uuid


@pytest.mark.parametrize("which", ["idle", "busy"])
async def test_renamed_host_is_refused(quiet: Quiet, tmp_path: Path, which: str) -> None:
    old = quiet.idle if which == "idle" else quiet.busy
    node_uuid = copy_identity(quiet, old, tmp_path)

    log = await refused(quiet, f"{old}-renamed", tmp_path)

    assert "Possible rename detected" in log
    servers = 0 if which == "idle" else 1
    assert f"{node_uuid} (from {tmp_path / 'compute_id'}) belongs to host {old!r}" in log
    assert f"which has {servers} server(s)" in log
    assert f"keel-manage service rename {old} {old}-renamed" in log


@pytest.mark.parametrize("hypervisor", ["same", "changed"])
async def test_lost_identity_file_is_refused(quiet: Quiet, tmp_path: Path, hypervisor: str) -> None:
    settings = {} if hypervisor == "same" else {"KEEL_COMPUTE__HYPERVISOR_HOSTNAME": "new-name"}

    log = await refused(quiet, quiet.busy, tmp_path, **settings)

    node_uuid = node_of(quiet.cloud, quiet.busy)
    assert "identity lost" in log
    assert f"echo {node_uuid} > {tmp_path / 'compute_id'}" in log
    assert not (tmp_path / "compute_id").exists()


async def test_garbage_identity_file_is_refused(quiet: Quiet, tmp_path: Path) -> None:
    (tmp_path / "compute_id").write_text("this is not a uuid\n")

    log = await refused(quiet, quiet.idle, tmp_path)

    assert f"the node identity file {tmp_path / 'compute_id'} is corrupt" in log
    assert (tmp_path / "compute_id").read_text() == "this is not a uuid\n"


async def test_conflicting_identity_copies_are_refused(quiet: Quiet, tmp_path: Path) -> None:
    state = tmp_path / "state"
    node_uuid = copy_identity(quiet, quiet.idle, state)
    other = uuid.uuid4()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "keel.toml").write_text("")
    (tmp_path / "etc" / "compute_id").write_text(f"{other}\n")

    log = await refused(quiet, quiet.idle, state, "--config", str(tmp_path / "etc" / "keel.toml"))

    assert "the node identity files disagree" in log
    assert f"{state / 'compute_id'} holds {node_uuid}" in log
    assert f"{tmp_path / 'etc' / 'compute_id'} holds {other}" in log


async def test_replaced_uuid_is_a_duplicate_node_record(quiet: Quiet, tmp_path: Path) -> None:
    (tmp_path / "compute_id").write_text(f"{uuid.uuid4()}\n")

    log = await refused(quiet, quiet.busy, tmp_path)

    assert f"duplicate compute node: host {quiet.busy!r} already has compute node" in log
    assert f"put {node_of(quiet.cloud, quiet.busy)} back in it" in log


async def test_new_host_whose_hypervisor_holds_servers_is_refused(
    quiet: Quiet, tmp_path: Path
) -> None:
    log = await refused(quiet, "newcomer", tmp_path, KEEL_COMPUTE__HYPERVISOR_HOSTNAME=quiet.busy)

    assert f"its hypervisor {quiet.busy!r} already holds servers: 1 under host" in log
    assert not (tmp_path / "compute_id").exists()


async def _release_1_host(cloud: Cloud, host: str, nodes: int) -> list[uuid.UUID]:
    """A compute host as an older release left it: no identity file anywhere."""
    made = [uuid.uuid4() for _ in range(nodes)]
    async with cloud.pool.acquire() as conn:
        service_id = await conn.fetchval(
            """INSERT INTO services (uuid, host, "binary", topic, version)
               VALUES ($1, $2, 'keel-compute', 'compute', $3) RETURNING id""",
            uuid.uuid4(),
            host,
            STABLE_IDENTITY_VERSION - 1,
        )
        for i, node_uuid in enumerate(made):
            await conn.execute(
                """INSERT INTO compute_nodes (uuid, service_id, host, hypervisor_hostname,
                                              vcpus, memory_mb, local_gb)
                   VALUES ($1, $2, $3, $4, 4, 8192, 100)""",
                node_uuid,
                service_id,
                host,
                host if i == 0 else f"{host}-{i}",
            )
    return made


async def test_upgrade_without_identity_file_adopts_the_hosts_only_node(
    quiet: Quiet, tmp_path: Path
) -> None:
    [node_uuid] = await _release_1_host(quiet.cloud, "upgraded", 1)

    agent = quiet.cloud.start_agent("upgraded", "upgraded", tmp_path)
    await quiet.cloud.wait_for_service("upgraded", up=True)

    assert (tmp_path / "compute_id").read_text() == f"{node_uuid}\n"
    assert agent.stop() == 0


async def test_upgrade_of_a_host_with_two_nodes_is_a_lost_identity(
    quiet: Quiet, tmp_path: Path
) -> None:
    first, _ = await _release_1_host(quiet.cloud, "ambiguous", 2)

    log = await refused(quiet, "ambiguous", tmp_path)

    assert "identity lost" in log
    assert str(first) in log
    assert not (tmp_path / "compute_id").exists()
