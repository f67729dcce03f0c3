"""keel-api behind a real Keystone: Keystone's users work on keel with the stock client;
a token Keystone revoked is refused within the cache bound; a Keystone outage is a 503
for tokens keel has not validated, while the ones it has are served until their cache
entry expires."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.e2e.cloud import Cloud
from tests.keystone.conftest import CACHE_TIME
from tests.keystone.server import Admin, Keystone

#: The first test's bound counts the module's set-up too (Keystone under gunicorn and a
#: cloud: 155 s on a machine loaded by other tiers), then six stock-client commands.
pytestmark = [pytest.mark.keystone, pytest.mark.timeout(600)]


def password_cloud(keystone: Keystone, user: str, password: str, project: str) -> str:
    """A clouds.yaml entry pointing at Keystone, as for any OpenStack cloud."""
    return (
        "    auth_type: password\n"
        "    auth:\n"
        f"      auth_url: '{keystone.v3}'\n"
        f"      username: '{user}'\n"
        f"      password: '{password}'\n"
        f"      project_name: '{project}'\n"
        "      user_domain_name: Default\n"
        "      project_domain_name: Default\n"
        "    identity_api_version: 3\n"
        "    region_name: RegionOne\n"
    )


async def status(cloud: Cloud, token: str) -> int:
    async with cloud.http(token) as http:
        return (await http.get("servers")).status_code


def test_a_keystone_user_boots_lists_and_deletes_a_server(
    cloud: Cloud, keystone: Keystone, admin: Admin
) -> None:
    alice = admin.member("alice", "alice-pw", "demo")
    with cloud.clouds_yaml.open("a", encoding="utf-8") as clouds:
        clouds.write("  ks-alice:\n" + password_cloud(keystone, "alice", "alice-pw", "demo"))
    token = cloud.openstack("token", "issue", cloud="ks-alice")
    assert token["user_id"] == alice
    server = cloud.openstack("server", "create", "--flavor", "m1.tiny", "--image", "cirros",
                             "--wait", "vm1", cloud="ks-alice")  # fmt: skip
    assert server["status"] == "ACTIVE"
    assert server["project_id"] == token["project_id"]
    listed = cloud.openstack("server", "list", cloud="ks-alice")
    assert [s["Name"] for s in listed] == ["vm1"]
    refused = cloud.openstack_raw("hypervisor", "list", cloud="ks-alice")
    assert refused.returncode != 0  # alice is a member, not an admin, in Keystone
    cloud.openstack("server", "delete", "--wait", "vm1", cloud="ks-alice", as_json=False)
    assert cloud.openstack("server", "list", cloud="ks-alice") == []
    assert httpx.get(f"{cloud.api_url}/identity/v3").status_code == 404


async def test_a_token_keystone_revoked_is_refused_within_the_cache_bound(
    cloud: Cloud, admin: Admin
) -> None:
    admin.member("bob", "bob-pw", "bobs")
    token = admin.token("bob", "bob-pw", "bobs")
    assert await status(cloud, token) == 200
    admin.revoke(token)
    revoked = time.monotonic()
    while await status(cloud, token) == 200:
        assert time.monotonic() - revoked <= CACHE_TIME + 2, "still accepted past the bound"
        await asyncio.sleep(0.25)
    assert await status(cloud, token) == 401


async def test_an_outage_is_503_except_for_tokens_validated_within_the_cache_time(
    cloud: Cloud, keystone: Keystone, admin: Admin
) -> None:
    admin.member("carol", "carol-pw", "carols")
    seen, unseen = (admin.token("carol", "carol-pw", "carols") for _ in range(2))
    assert await status(cloud, seen) == 200
    validated = time.monotonic()
    await asyncio.to_thread(keystone.stop)
    assert time.monotonic() - validated < CACHE_TIME - 1, "Keystone took too long to stop"
    assert await status(cloud, seen) == 200
    async with cloud.http(unseen) as http:
        away = await http.get("servers")
    assert away.status_code == 503
    assert "Keystone" in away.json()["serviceUnavailable"]["message"]
    assert int(away.headers["Retry-After"]) > 0
    await asyncio.sleep(max(0.0, validated + CACHE_TIME - time.monotonic()) + 0.5)
    assert await status(cloud, seen) == 503
    await asyncio.to_thread(keystone.start)
    assert await status(cloud, seen) == 200
    assert await status(cloud, unseen) == 200
