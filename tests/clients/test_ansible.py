"""Ansible's openstack.cloud collection against keel, as a user runs a playbook.

``make test-clients`` installs the ``ansible`` package from PyPI (it bundles the
openstack.cloud collection) into a virtualenv of its own, ``.clients-venv``, named here
by ``KEEL_CLIENTS_VENV``; without it the test is skipped, saying why (under CI it fails
instead: the tier ``clients`` runs there). The playbook makes
a key pair, an anti-affinity server group and three servers in it; run again it changes
nothing; then ``absent.yml`` deletes it all.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cloud import Cloud, CloudConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PLAYBOOKS = Path(__file__).with_name("playbooks")
HOSTS = ("an-1", "an-2", "an-3")
#: ``ok=N changed=N unreachable=N failed=N`` of the play recap.
RECAP = re.compile(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=HOSTS)


def venv() -> Path:
    found = Path(os.environ.get("KEEL_CLIENTS_VENV", ".clients-venv"))
    if not (found / "bin" / "ansible-playbook").exists():
        why = f"no ansible-playbook in {found}: run `make test-clients`"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


def play(cloud: Cloud, name: str) -> tuple[int, int]:
    """Run a playbook; ``(ok, changed)`` from its recap, after asserting it failed nothing."""
    env = {
        **os.environ,
        "OS_CLIENT_CONFIG_FILE": str(cloud.clouds_yaml),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_NOCOLOR": "true",
        "ANSIBLE_HOME": str(cloud.workdir / "ansible"),
    }
    done = subprocess.run(
        [str(venv() / "bin" / "ansible-playbook"), str(PLAYBOOKS / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    recap = RECAP.search(output)
    assert recap is not None, output
    ok, changed, unreachable, failed = (int(n) for n in recap.groups())
    assert (unreachable, failed) == (0, 0), output
    return ok, changed


async def test_a_playbook_makes_three_spread_servers_then_changes_nothing_then_removes_them(
    cloud: Cloud,
) -> None:
    venv()
    assert play(cloud, "present.yml") == (3, 3)
    servers = cloud.openstack("server", "list", "--long")
    hosts = sorted(s["Host"] for s in servers if s["Name"].startswith("ansible-"))
    assert hosts == list(HOSTS)
    groups = cloud.openstack("server", "group", "list")
    assert [g["Name"] for g in groups] == ["ansible-spread"]

    assert play(cloud, "present.yml") == (3, 0)

    assert play(cloud, "absent.yml")[1] == 3
    assert cloud.openstack("server", "list") == []
    assert cloud.openstack("server", "group", "list") == []
    assert json.dumps(cloud.openstack("keypair", "list")) == "[]"
