"""Soft delete with the real openstack CLI: a cloud with KEEL_RECLAIM_INSTANCE_INTERVAL set
keeps a deleted server, which ``server restore`` brings back and ``server delete --force``
deletes at once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.cloud import Cloud, CloudConfig
from tests.e2e.test_compute_cloud import wait_for_status

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(env=(("KEEL_RECLAIM_INSTANCE_INTERVAL", "3600"),))


def test_delete_keeps_the_server_restore_brings_it_back_force_delete_ends_it(
    cloud: Cloud,
) -> None:
    server: dict[str, Any] = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", "kept"
    )
    sid = server["id"]

    cloud.openstack("server", "delete", sid, as_json=False)
    deleted = wait_for_status(cloud, sid, {"SOFT_DELETED"})
    listed = [s["ID"] for s in cloud.openstack("server", "list")]
    cloud.openstack("server", "restore", sid, as_json=False)
    restored = wait_for_status(cloud, sid, {"ACTIVE"})
    cloud.openstack("server", "delete", sid, as_json=False)
    wait_for_status(cloud, sid, {"SOFT_DELETED"})
    events = [e["Action"] for e in cloud.openstack("server", "event", "list", sid)]
    cloud.openstack("server", "delete", "--force", "--wait", sid, as_json=False)
    after = cloud.openstack_raw("server", "show", sid)

    assert (deleted["status"], deleted["OS-EXT-STS:power_state"]) == ("SOFT_DELETED", 4)
    assert listed == []  # as in Nova, lists leave soft-deleted servers out
    assert (restored["status"], restored["OS-EXT-STS:power_state"]) == ("ACTIVE", 1)
    assert events == ["delete", "restore", "delete", "create"]
    assert after.returncode != 0
    assert "No Server found" in after.stderr
