"""The two cases of the identity work that a new user hits, with the real processes.

* A real keel-compute started under a new host name, without its identity file, on a
  state directory that still holds another node's guests: refused, the database as it
  was. The machine is played by a copy of a host's state directory (its identity file
  left out), as a renamed machine or a copied disk would present it. The cloud's agents
  are stopped first, so nothing else writes the rows compared.
* ``keel-manage status upgrade-check`` while a row written by release 1 lacks its link.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.cloud import Cloud

pytestmark = pytest.mark.e2e


async def test_a_renamed_machine_with_another_nodes_guests_is_refused(
    cloud: Cloud, tmp_path: Path
) -> None:
    server = await cloud.create_server("left-behind")
    host = server["OS-EXT-SRV-ATTR:host"]
    assert (cloud.state_dir(host) / "instances" / server["id"]).is_dir()
    for agent in cloud.config.computes:
        assert cloud.processes[agent].stop() == 0
    state = tmp_path / "state"
    shutil.copytree(cloud.state_dir(host), state, ignore=shutil.ignore_patterns("compute_id"))
    before = await cloud.dump()

    code, log = cloud.run_agent(f"{host}-renamed", state)

    assert code == 1, log
    assert "keel-compute cannot run: a new service whose hypervisor already holds instances" in (
        log
    )
    assert f"host '{host}-renamed' is new to the database" in log
    assert f"{state / 'instances'} holds 1 guest(s): {server['id']}" in log
    assert "Traceback" not in log
    assert await cloud.dump() == before
    assert not (state / "compute_id").exists()
    assert (state / "instances" / server["id"]).is_dir()


async def test_upgrade_check_warns_while_a_row_lacks_its_link(cloud: Cloud) -> None:
    """A server row as release 1 wrote it (no compute node id): exit 1, how many rows and
    the online migration that links them; after the migration, exit 0."""
    async with cloud.pool.acquire() as conn:
        server = await conn.fetchval(
            "SELECT uuid FROM instances WHERE deleted_at IS NULL ORDER BY id LIMIT 1"
        )
        await conn.execute("UPDATE instances SET compute_id = NULL WHERE uuid = $1", server)

    warned = cloud.manage("status", "upgrade-check")

    assert warned.returncode == 1, warned.stdout + warned.stderr
    assert (
        "WARNING: 1 row(s) written by an older release lack their link instances.compute_id: "
        "run `keel-manage db online-data-migrations` (migration instances.compute_id)"
    ) in warned.stdout
    assert "SUCCESS" not in warned.stdout
    migrated = cloud.manage("db", "online-data-migrations")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    settled = cloud.manage("status", "upgrade-check")
    assert settled.returncode == 0, settled.stdout
    assert "SUCCESS" in settled.stdout
