"""A real keel-compute started under a new host name, without its identity file, on a
state directory that still holds another node's guests: refused, the database as it was.

The machine is played by a copy of a host's state directory (its identity file left
out), as a renamed machine or a copied disk would present it. The cloud's agents are
stopped first, so nothing else writes the rows compared.
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
