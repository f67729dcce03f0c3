"""Operator tools with the real processes and the stock client: ``openstack server set
--state`` (Nova's ``os-resetState``) and ``keel-manage placement audit``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.cloud import Cloud

pytestmark = pytest.mark.e2e


def show(cloud: Cloud, server_id: str, *, as_cloud: str = "keel") -> dict[str, Any]:
    shown: dict[str, Any] = cloud.openstack("server", "show", server_id, cloud=as_cloud)
    return shown


def set_state(cloud: Cloud, server_id: str, state: str, *, as_cloud: str = "keel") -> Any:
    return cloud.openstack_raw(
        "server", "set", "--state", state, "--auto-approve", server_id,
        cloud=as_cloud, as_json=False,
    )  # fmt: skip


async def test_an_admin_sets_a_server_to_error_and_back_to_active(cloud: Cloud) -> None:
    server = await cloud.create_server("reset-me")

    to_error = set_state(cloud, server["id"], "error")
    assert to_error.returncode == 0, to_error.stderr
    assert show(cloud, server["id"])["status"] == "ERROR"

    to_active = set_state(cloud, server["id"], "active")
    assert to_active.returncode == 0, to_active.stderr
    shown = show(cloud, server["id"])
    assert (shown["status"], shown["OS-EXT-STS:task_state"]) == ("ACTIVE", None)

    events = cloud.openstack("server", "event", "list", server["id"])
    assert [e["Action"] for e in events].count("resetState") == 2
    await cloud.delete_server(server["id"])


async def test_a_member_is_refused_with_403_and_other_states_are_400(cloud: Cloud) -> None:
    created = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", "mine",
        cloud="keel-member",
    )  # fmt: skip
    assert created["status"] == "ACTIVE"

    refused = set_state(cloud, created["id"], "error", as_cloud="keel-member")
    assert refused.returncode != 0
    assert "403" in refused.stderr
    assert "os_compute_api:os-admin-actions:reset_state" in refused.stderr
    assert show(cloud, created["id"], as_cloud="keel-member")["status"] == "ACTIVE"

    # The client offers only active and error; other states are the API's to refuse.
    async with cloud.http(cloud.admin_token) as http:
        for state in ("stopped", "deleted", "building"):
            answer = await http.post(
                f"servers/{created['id']}/action", json={"os-resetState": {"state": state}}
            )
            assert answer.status_code == 400, answer.text
            assert "is not one of ['active', 'error']" in answer.json()["badRequest"]["message"]
    assert show(cloud, created["id"])["status"] == "ACTIVE"


async def test_the_claims_of_a_working_cloud_pass_the_audit_and_a_leak_is_removed(
    cloud: Cloud,
) -> None:
    """After builds, resets and deletes, every claim is justified; a claim left behind
    by a server deleted behind keel's back is found and removed."""
    kept = await cloud.create_server("audited")
    gone = await cloud.create_server("leaking")
    clean = cloud.manage("placement", "audit")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "0 claim(s) no live server or move justifies." in clean.stdout

    async with cloud.pool.acquire() as conn:
        await conn.execute("UPDATE instances SET deleted_at = now() WHERE uuid = $1", gone["id"])
    leaking = cloud.manage("placement", "audit", "--delete")

    assert leaking.returncode == 0, leaking.stdout + leaking.stderr
    assert "1 claim(s) no live server or move justifies:" in leaking.stdout
    assert f"(server {gone['id']})" in leaking.stdout
    assert "its server was deleted — removed" in leaking.stdout
    async with cloud.pool.acquire() as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM allocations WHERE instance_uuid = $1", gone["id"]
            )
            == 0
        )
    after = cloud.manage("placement", "audit")
    assert after.returncode == 0, after.stdout
    await cloud.delete_server(kept["id"])
