"""Password auth end to end: users made with keel-manage, a plain clouds.yaml, the real
``openstack`` CLI and openstacksdk finding every endpoint in the token's catalog.

Also: key pairs and ``--key-name``, quotas and limits, usage, a member confined to its
project, and ten concurrent creates against a quota of three.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openstack
import pytest

from tests.e2e.cloud import BIN, CIRROS_ID, Cloud

pytestmark = pytest.mark.e2e

MEMBER_CLOUD = "pw-member"
ADMIN_CLOUD = "pw-admin"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKyZymnQuOY/S4Sk68YlgH3Oxzf2Bp+IACeozsJtZbBO e2e"


@dataclass(frozen=True)
class Identity:
    member_project_id: str
    admin_project_id: str
    burst_project_id: str


def manage(cloud: Cloud, *args: str, stdin: str = "") -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["KEEL_DATABASE_URL"] = cloud.database_url
    result = subprocess.run(
        [str(BIN / "keel-manage"), *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def password_cloud(api_url: str, user: str, password: str, project: str) -> str:
    """A clouds.yaml entry as any OpenStack cloud's: auth URL and names, no endpoints."""
    return (
        "    auth_type: password\n"
        "    auth:\n"
        f"      auth_url: '{api_url}/identity/v3'\n"
        f"      username: '{user}'\n"
        f"      password: '{password}'\n"
        f"      project_name: '{project}'\n"
        "      user_domain_name: Default\n"
        "      project_domain_name: Default\n"
        "    identity_api_version: 3\n"
    )


@pytest.fixture(scope="module")
def identity(cloud: Cloud) -> Identity:
    """Projects web, ops and burst; alice (member of web) and root (admin of ops)."""
    web = manage(cloud, "project", "create", "web")
    ops = manage(cloud, "project", "create", "ops")
    burst = manage(cloud, "project", "create", "burst")
    manage(cloud, "user", "create", "alice", "--project", "web", stdin="alice-pw\n")
    manage(cloud, "user", "create", "root", "--project", "ops", "--role", "admin",
           "--password", "root-pw")  # fmt: skip
    manage(cloud, "user", "create", "bursty", "--project", "burst", "--password", "burst-pw")
    with cloud.clouds_yaml.open("a", encoding="utf-8") as clouds:
        clouds.write(f"  {MEMBER_CLOUD}:\n")
        clouds.write(password_cloud(cloud.api_url, "alice", "alice-pw", "web"))
        clouds.write(f"  {ADMIN_CLOUD}:\n")
        clouds.write(password_cloud(cloud.api_url, "root", "root-pw", "ops"))
    return Identity(member_project_id=web, admin_project_id=ops, burst_project_id=burst)


def create_server(cloud: Cloud, name: str, on: str, *extra: str) -> dict[str, Any]:
    server: dict[str, Any] = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", *extra, name,
        cloud=on,
    )  # fmt: skip
    assert server["status"] == "ACTIVE", server
    return server


def delete_servers(cloud: Cloud, on: str, *ids: str) -> None:
    cloud.openstack("server", "delete", "--wait", *ids, cloud=on, as_json=False)


def test_member_works_through_the_catalog_alone(
    cloud: Cloud, identity: Identity, tmp_path: Path
) -> None:
    key_file = tmp_path / "laptop.pub"
    key_file.write_text(PUBLIC_KEY + "\n")
    key = cloud.openstack("keypair", "create", "--public-key", str(key_file), "laptop",
                          cloud=MEMBER_CLOUD)  # fmt: skip
    assert key["fingerprint"] == "27:9e:81:f7:0c:3e:4b:fa:d2:f6:36:a6:18:9d:c4:f8"
    generated = cloud.openstack("keypair", "create", "made", cloud=MEMBER_CLOUD, as_json=False)
    assert "PRIVATE KEY" in generated
    names = {k["Name"] for k in cloud.openstack("keypair", "list", cloud=MEMBER_CLOUD)}
    assert names == {"laptop", "made"}

    server = create_server(cloud, "web1", MEMBER_CLOUD, "--key-name", "laptop")
    assert server["project_id"] == identity.member_project_id
    shown = cloud.openstack("server", "show", "web1", cloud=MEMBER_CLOUD)
    assert shown["key_name"] == "laptop"
    assert shown["image"].startswith("cirros")

    quota = {q["Resource"]: q["Limit"] for q in cloud.openstack("quota", "show",
                                                                 cloud=MEMBER_CLOUD)}  # fmt: skip
    assert (quota["instances"], quota["cores"], quota["ram"]) == (10, 20, 51200)
    limits = cloud.openstack("limits", "show", "--absolute", cloud=MEMBER_CLOUD)
    absolute = {row["Name"]: row["Value"] for row in limits}
    assert absolute["total_instances_used"] == 1
    assert absolute["max_total_instances"] == 10
    usage = cloud.openstack("usage", "show", cloud=MEMBER_CLOUD)
    assert [s["name"] for s in usage["Servers"]] == ["web1"]

    delete_servers(cloud, MEMBER_CLOUD, server["id"])
    cloud.openstack("keypair", "delete", "laptop", "made", cloud=MEMBER_CLOUD, as_json=False)


def test_members_see_only_their_projects_servers(cloud: Cloud, identity: Identity) -> None:
    mine = create_server(cloud, "mine", MEMBER_CLOUD)
    theirs = create_server(cloud, "theirs", ADMIN_CLOUD)
    seen = [s["ID"] for s in cloud.openstack("server", "list", cloud=MEMBER_CLOUD)]
    assert seen == [mine["id"]]
    refused = cloud.openstack_raw("server", "show", theirs["id"], cloud=MEMBER_CLOUD)
    assert refused.returncode != 0
    everyone = cloud.openstack("server", "list", "--all-projects", cloud=ADMIN_CLOUD)
    assert {s["ID"] for s in everyone} == {mine["id"], theirs["id"]}
    assert cloud.openstack("server", "list", cloud="keel") == []

    usage = cloud.openstack("usage", "list", cloud=ADMIN_CLOUD)
    projects = {identity.member_project_id, identity.admin_project_id}
    assert {row["Project"] for row in usage} >= projects

    delete_servers(cloud, MEMBER_CLOUD, mine["id"])
    delete_servers(cloud, ADMIN_CLOUD, theirs["id"])


def test_admin_resolves_project_names_and_sets_quotas(cloud: Cloud, identity: Identity) -> None:
    projects = {p["Name"]: p["ID"] for p in cloud.openstack("project", "list", cloud=ADMIN_CLOUD)}
    assert projects == {
        "web": identity.member_project_id,
        "ops": identity.admin_project_id,
        "burst": identity.burst_project_id,
    }
    cloud.openstack("quota", "set", "--instances", "5", "web", cloud=ADMIN_CLOUD, as_json=False)
    quota = {q["Resource"]: q["Limit"] for q in cloud.openstack("quota", "show", "web",
                                                                 cloud=ADMIN_CLOUD)}  # fmt: skip
    assert quota["instances"] == 5
    refused = cloud.openstack_raw("quota", "set", "--instances", "5", "ops", cloud=MEMBER_CLOUD)
    assert refused.returncode != 0
    cloud.openstack("quota", "delete", "web", cloud=ADMIN_CLOUD, as_json=False)


@pytest.fixture
def sdk(cloud: Cloud, identity: Identity) -> Iterator[openstack.connection.Connection]:
    config = openstack.config.OpenStackConfig(config_files=[str(cloud.clouds_yaml)])
    connection = openstack.connection.Connection(config=config.get_one(MEMBER_CLOUD))
    yield connection
    connection.close()


@pytest.mark.filterwarnings("ignore")  # the SDK's own deprecation notices
def test_the_sdk_connects_with_the_password_cloud(
    sdk: openstack.connection.Connection, identity: Identity
) -> None:
    assert sdk.current_project_id == identity.member_project_id
    made = sdk.compute.create_keypair(name="sdk-made")
    assert made.private_key is not None
    assert "PRIVATE KEY" in made.private_key
    assert [k.name for k in sdk.compute.keypairs()] == ["sdk-made"]
    image = sdk.image.find_image("cirros")
    assert image is not None
    assert image.id == str(CIRROS_ID)
    limits = sdk.compute.get_limits()
    assert limits.absolute.instances == 10
    assert list(sdk.compute.servers()) == []
    sdk.compute.delete_keypair("sdk-made")


async def test_ten_concurrent_creates_against_a_quota_of_three(
    cloud: Cloud, identity: Identity
) -> None:
    cloud.openstack("quota", "set", "--instances", "3", "burst", cloud=ADMIN_CLOUD, as_json=False)
    auth = {
        "auth": {
            "identity": {
                "methods": ["password"],
                "password": {
                    "user": {"name": "bursty", "domain": {"id": "default"}, "password": "burst-pw"}
                },
            },
            "scope": {"project": {"name": "burst", "domain": {"id": "default"}}},
        }
    }
    async with httpx.AsyncClient(base_url=cloud.api_url, timeout=60) as http:
        issued = await http.post("/identity/v3/auth/tokens", json=auth)
        assert issued.status_code == 201, issued.text
        token = issued.headers["X-Subject-Token"]

    async def one_create(i: int) -> httpx.Response:
        body = {"server": {"name": f"burst-{i}", "flavorRef": "1", "imageRef": str(CIRROS_ID)}}
        async with cloud.http(token) as client:
            return await client.post("servers", json=body)

    answers = await asyncio.gather(*(one_create(i) for i in range(10)))
    assert sorted(a.status_code for a in answers) == [202] * 3 + [403] * 7
    refused = next(a for a in answers if a.status_code == 403)
    assert refused.json()["forbidden"]["message"] == (
        "Quota exceeded for instances: Requested 1, but already used 3 of 3 instances"
    )
    async with cloud.pool.acquire() as conn:
        rows = await conn.fetchval(
            "SELECT count(*) FROM instances WHERE project_id = $1", identity.burst_project_id
        )
    assert rows == 3
    created = [a.json()["server"]["id"] for a in answers if a.status_code == 202]
    await asyncio.to_thread(delete_servers, cloud, ADMIN_CLOUD, *created)


def sdk_cloud_layer_round_trip(sdk: openstack.connection.Connection) -> tuple[Any, Any, bool]:
    """The cloud layer with every default (auto_ip included): create, list, delete."""
    server = sdk.create_server("sdk-default", image="cirros", flavor="m1.tiny", wait=True,
                               timeout=90)  # fmt: skip
    listed = [s for s in sdk.list_servers() if s.id == server.id]
    deleted = sdk.delete_server(server.id, wait=True, timeout=90)
    return server, listed, deleted


@pytest.mark.filterwarnings("ignore")  # the SDK's own deprecation notices
async def test_the_sdk_cloud_layer_creates_and_deletes_with_its_defaults(
    sdk: openstack.connection.Connection,
) -> None:
    server, listed, deleted = await asyncio.to_thread(sdk_cloud_layer_round_trip, sdk)
    assert server.status == "ACTIVE"
    [address] = server.addresses["private"]
    # The pool is an external network: the server's own address is its public one, so
    # the SDK needs no floating IP.
    assert server.public_v4 == address["addr"]
    assert [s.name for s in listed] == ["sdk-default"]
    assert deleted is True
    assert sdk.get_server(server.id) is None
