"""The identity admin API: projects, users, roles and role assignments, as Keystone's.

Driven as Tempest's dynamic credentials and Rally's ``users`` context drive it: an admin
creates a project, a user in it, finds a role by name and grants it; the new user gets a
token and uses it; then everything is deleted again, and the token with it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import DatabaseSettings, Settings
from shared.db import instances, users
from shared.db.pool import create_pool
from shared.objects.flavor import FlavorSnapshot
from shared.rpc.amqp import AmqpTransport
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.api.conftest import ADMIN
from tests.functional.services.api.identity_fixtures import add_person, token_for

pytestmark = pytest.mark.functional

V3 = "/identity/v3"
OUTAGE_SETTINGS = DatabaseSettings(connect_timeout=5, acquire_timeout=1, command_timeout=2)


async def created(client: httpx.AsyncClient, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(f"{V3}/{kind}s", json={kind: body}, headers=ADMIN)
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()[kind]
    return made


async def role_id(client: httpx.AsyncClient, name: str) -> str:
    listed = await client.get(f"{V3}/roles", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    [found] = [r for r in listed.json()["roles"] if r["name"].lower() == name.lower()]
    return str(found["id"])


async def password_token(
    client: httpx.AsyncClient, user: str, password: str, project_id: str
) -> httpx.Response:
    body = {
        "auth": {
            "identity": {
                "methods": ["password"],
                "password": {"user": {"id": user, "password": password}},
            },
            "scope": {"project": {"id": project_id}},
        }
    }
    return await client.post(f"{V3}/auth/tokens", json=body)


async def new_member(client: httpx.AsyncClient, name: str) -> tuple[str, str, str]:
    """A project, a user with ``member`` there (as Tempest makes them); their token."""
    project = await created(client, "project", {"name": name, "domain_id": "default"})
    user = await created(
        client,
        "user",
        {"name": f"{name}-user", "password": "pw-" + name, "domain_id": "default"},
    )
    grant = f"{V3}/projects/{project['id']}/users/{user['id']}/roles/"
    member = await role_id(client, "member")
    assert (await client.put(grant + member, headers=ADMIN)).status_code == 204
    issued = await password_token(client, user["id"], "pw-" + name, project["id"])
    assert issued.status_code == 201, issued.text
    return project["id"], user["id"], issued.headers["X-Subject-Token"]


async def test_tempest_style_credentials_work_then_go_away(client: httpx.AsyncClient) -> None:
    [domain] = (await client.get(f"{V3}/domains?name=Default", headers=ADMIN)).json()["domains"]
    assert domain["id"] == "default"
    project_id, user_id, token = await new_member(client, "tempest-1")
    own = {"X-Auth-Token": token, "X-Subject-Token": token}
    body = (await client.get(f"{V3}/auth/tokens", headers=own)).json()["token"]
    assert sorted(r["name"] for r in body["roles"]) == ["member", "reader"]
    headers = {"X-Auth-Token": token}
    assert (await client.get("/v2.1/servers", headers=headers)).status_code == 200
    assert (await client.get("/v2.1/os-hypervisors", headers=headers)).status_code == 403

    assert (await client.delete(f"{V3}/users/{user_id}", headers=ADMIN)).status_code == 204
    assert (await client.get("/v2.1/servers", headers=headers)).status_code == 401
    assert (await client.delete(f"{V3}/projects/{project_id}", headers=ADMIN)).status_code == 204
    assert (await client.get(f"{V3}/projects/{project_id}", headers=ADMIN)).status_code == 404
    again = await client.delete(f"{V3}/users/{user_id}", headers=ADMIN)
    assert again.status_code == 404
    assert again.json()["error"]["code"] == 404


async def test_objects_show_keystone_fields_and_extra_attributes(
    client: httpx.AsyncClient,
) -> None:
    project = await created(client, "project", {"name": "web", "description": "the web team"})
    assert project["domain_id"] == project["parent_id"] == "default"
    assert project["enabled"] is True
    assert project["is_domain"] is False
    user = await created(
        client,
        "user",
        {"name": "alice", "email": "alice@example.org", "default_project_id": project["id"]},
    )
    assert user["email"] == "alice@example.org"
    assert user["default_project_id"] == project["id"]
    assert "password" not in user
    shown = await client.get(f"{V3}/users/{user['id']}", headers=ADMIN)
    assert shown.json()["user"]["email"] == "alice@example.org"
    role = await created(client, "role", {"name": "auditor", "description": "reads"})
    assert role["domain_id"] is None
    assert role["description"] == "reads"
    renamed = await client.patch(
        f"{V3}/projects/{project['id']}",
        json={"project": {"name": "www", "tags": ["a"]}},
        headers=ADMIN,
    )
    assert renamed.status_code == 200, renamed.text
    assert renamed.json()["project"]["name"] == "www"
    assert renamed.json()["project"]["tags"] == ["a"]
    patched = await client.patch(
        f"{V3}/roles/{role['id']}", json={"role": {"name": "Auditor"}}, headers=ADMIN
    )
    assert patched.json()["role"]["name"] == "Auditor"


async def test_a_user_without_a_password_never_authenticates(client: httpx.AsyncClient) -> None:
    project = await created(client, "project", {"name": "web"})
    user = await created(client, "user", {"name": "nopass", "default_project_id": project["id"]})
    member = await role_id(client, "member")
    grant = f"{V3}/projects/{project['id']}/users/{user['id']}/roles/{member}"
    assert (await client.put(grant, headers=ADMIN)).status_code == 204
    for password in ("", "x", "scrypt$"):
        refused = await password_token(client, user["id"], password or "p", project["id"])
        assert refused.status_code == 401


async def test_disabling_revokes_tokens_and_refuses_new_ones(client: httpx.AsyncClient) -> None:
    project_id, user_id, token = await new_member(client, "web")
    _, other_id, other_token = await new_member(client, "ops")
    off = {"enabled": False}
    patched = await client.patch(f"{V3}/users/{user_id}", json={"user": off}, headers=ADMIN)
    assert patched.json()["user"]["enabled"] is False
    assert (await client.get("/v2.1/servers", headers={"X-Auth-Token": token})).status_code == 401
    assert (await password_token(client, user_id, "pw-web", project_id)).status_code == 401
    on = await client.patch(
        f"{V3}/users/{user_id}", json={"user": {"enabled": True}}, headers=ADMIN
    )
    assert on.status_code == 200
    assert (await client.get("/v2.1/servers", headers={"X-Auth-Token": token})).status_code == 401
    assert (await password_token(client, user_id, "pw-web", project_id)).status_code == 201

    [ops] = (await client.get(f"{V3}/projects?name=ops", headers=ADMIN)).json()["projects"]
    await client.patch(f"{V3}/projects/{ops['id']}", json={"project": off}, headers=ADMIN)
    other = {"X-Auth-Token": other_token}
    assert (await client.get("/v2.1/servers", headers=other)).status_code == 401
    assert (await password_token(client, other_id, "pw-ops", ops["id"])).status_code == 401
    disabled = await client.get(f"{V3}/projects?enabled=false", headers=ADMIN)
    assert [p["name"] for p in disabled.json()["projects"]] == ["ops"]


async def test_a_new_password_revokes_tokens_and_the_old_one(client: httpx.AsyncClient) -> None:
    project_id, user_id, token = await new_member(client, "web")
    patch = {"user": {"password": "new-pass"}}
    assert (await client.patch(f"{V3}/users/{user_id}", json=patch, headers=ADMIN)).is_success
    assert (await client.get("/v2.1/servers", headers={"X-Auth-Token": token})).status_code == 401
    assert (await password_token(client, user_id, "pw-web", project_id)).status_code == 401
    assert (await password_token(client, user_id, "new-pass", project_id)).status_code == 201
    change = {"user": {"password": "mine", "original_password": "wrong"}}
    wrong = await client.post(f"{V3}/users/{user_id}/password", json=change)
    assert wrong.status_code == 401
    change["user"]["original_password"] = "new-pass"
    assert (await client.post(f"{V3}/users/{user_id}/password", json=change)).status_code == 204
    assert (await password_token(client, user_id, "mine", project_id)).status_code == 201


async def test_grants_are_idempotent_checked_listed_and_revoked(
    client: httpx.AsyncClient,
) -> None:
    project_id, user_id, token = await new_member(client, "web")
    admin = await role_id(client, "admin")
    grant = f"{V3}/projects/{project_id}/users/{user_id}/roles/{admin}"
    assert (await client.head(grant, headers=ADMIN)).status_code == 404
    for _ in range(2):
        assert (await client.put(grant, headers=ADMIN)).status_code == 204
    assert (await client.head(grant, headers=ADMIN)).status_code == 204
    listed = await client.get(f"{V3}/projects/{project_id}/users/{user_id}/roles", headers=ADMIN)
    assert sorted(r["name"] for r in listed.json()["roles"]) == ["admin", "member"]
    headers = {"X-Auth-Token": token}
    assert (await client.get("/v2.1/os-hypervisors", headers=headers)).status_code == 200
    assert (await client.delete(grant, headers=ADMIN)).status_code == 204
    assert (await client.delete(grant, headers=ADMIN)).status_code == 404
    assert (await client.get("/v2.1/servers", headers=headers)).status_code == 401
    auditor = await created(client, "role", {"name": "auditor"})
    again = await password_token(client, user_id, "pw-web", project_id)
    held = f"{V3}/projects/{project_id}/users/{user_id}/roles/{auditor['id']}"
    assert (await client.put(held, headers=ADMIN)).status_code == 204
    fresh = {"X-Auth-Token": again.headers["X-Subject-Token"]}
    assert (await client.delete(f"{V3}/roles/{auditor['id']}", headers=ADMIN)).status_code == 204
    assert (await client.get("/v2.1/servers", headers=fresh)).status_code == 401
    for path in (
        f"{V3}/projects/nope/users/{user_id}/roles/{admin}",
        f"{V3}/projects/{project_id}/users/nope/roles/{admin}",
        f"{V3}/projects/{project_id}/users/{user_id}/roles/nope",
    ):
        missing = await client.put(path, headers=ADMIN)
        assert missing.status_code == 404, path
        assert "nope" in missing.json()["error"]["message"]


async def test_role_assignments_with_filters_effective_and_names(
    client: httpx.AsyncClient,
) -> None:
    project_id, user_id, _ = await new_member(client, "web")
    await new_member(client, "ops")
    member = await role_id(client, "member")
    plain = await client.get(f"{V3}/role_assignments?user.id={user_id}", headers=ADMIN)
    assert plain.json()["role_assignments"] == [
        {
            "role": {"id": member},
            "user": {"id": user_id},
            "scope": {"project": {"id": project_id}},
            "links": {
                "assignment": f"http://keel.test/identity/v3/projects/{project_id}"
                f"/users/{user_id}/roles/{member}"
            },
        }
    ]
    effective = await client.get(
        f"{V3}/role_assignments",
        params={"scope.project.id": project_id, "effective": "", "include_names": "1"},
        headers=ADMIN,
    )
    entries = effective.json()["role_assignments"]
    assert [e["role"]["name"] for e in entries] == ["member", "reader"]
    assert entries[1]["links"]["prior_role"].endswith(f"/roles/{member}")
    assert entries[0]["scope"]["project"]["name"] == "web"
    everything = await client.get(f"{V3}/role_assignments", headers=ADMIN)
    assert len(everything.json()["role_assignments"]) == 2
    for nothing in ("group.id=g", "scope.domain.id=default", "scope.system=all"):
        empty = await client.get(f"{V3}/role_assignments?{nothing}", headers=ADMIN)
        assert empty.json()["role_assignments"] == []


async def test_members_may_change_nothing_and_see_only_themselves(
    client: httpx.AsyncClient,
) -> None:
    project_id, user_id, token = await new_member(client, "web")
    other_project, other_user, _ = await new_member(client, "ops")
    headers = {"X-Auth-Token": token}
    refused = [
        client.post(f"{V3}/projects", json={"project": {"name": "x"}}, headers=headers),
        client.patch(f"{V3}/projects/{project_id}", json={"project": {}}, headers=headers),
        client.delete(f"{V3}/projects/{other_project}", headers=headers),
        client.post(f"{V3}/users", json={"user": {"name": "x"}}, headers=headers),
        client.patch(f"{V3}/users/{user_id}", json={"user": {"enabled": True}}, headers=headers),
        client.delete(f"{V3}/users/{other_user}", headers=headers),
        client.post(f"{V3}/roles", json={"role": {"name": "x"}}, headers=headers),
        client.get(f"{V3}/roles", headers=headers),
        client.put(f"{V3}/projects/{project_id}/users/{user_id}/roles/x", headers=headers),
        client.get(f"{V3}/role_assignments", headers=headers),
        client.get(f"{V3}/role_assignments?user.id={other_user}", headers=headers),
        client.get(f"{V3}/users/{other_user}/projects", headers=headers),
    ]
    for response in await asyncio.gather(*refused):
        assert response.status_code == 403, (response.request.url, response.text)
        assert "identity:" in response.json()["error"]["message"]
    mine = await client.get(f"{V3}/role_assignments?user.id={user_id}", headers=headers)
    assert len(mine.json()["role_assignments"]) == 1
    own_roles = await client.get(
        f"{V3}/projects/{project_id}/users/{user_id}/roles", headers=headers
    )
    assert [r["name"] for r in own_roles.json()["roles"]] == ["member"]


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("projects", {"project": {}}, 400),
        ("projects", {"project": {"name": ""}}, 400),
        ("projects", {"project": {"name": "x" * 65}}, 400),
        ("projects", {"project": {"name": "x", "domain_id": "other"}}, 400),
        ("projects", {"project": {"name": "x", "is_domain": True}}, 400),
        ("projects", {"project": {"name": "x", "parent_id": "p"}}, 400),
        ("projects", {"project": {"name": "x", "enabled": "maybe"}}, 400),
        ("projects", {"project": "x"}, 400),
        ("users", {"user": {"name": "x", "options": {"lock_password": True}}}, 400),
        ("users", {"user": {"name": "x", "default_project_id": "nope"}}, 404),
        ("users", {"user": {"name": "x", "password": "p" * 1025}}, 400),
        ("roles", {"role": {"name": "x", "domain_id": "default"}}, 400),
        ("roles", {"role": {"name": "MEMBER"}}, 409),
        ("domains", {"domain": {"name": "x"}}, 403),
    ],
)
async def test_bad_requests_are_4xx_with_an_identity_error(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], code: int
) -> None:
    response = await client.post(f"{V3}/{path}", json=body, headers=ADMIN)
    assert response.status_code == code, response.text
    assert response.json()["error"]["code"] == code


async def test_duplicate_names_are_409(client: httpx.AsyncClient) -> None:
    await created(client, "project", {"name": "web"})
    await created(client, "user", {"name": "alice"})
    for kind, name in (("project", "web"), ("user", "alice")):
        again = await client.post(f"{V3}/{kind}s", json={kind: {"name": name}}, headers=ADMIN)
        assert again.status_code == 409


async def test_concurrent_twins_make_one_object_and_one_grant(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    web = {"project": {"name": "web"}}
    twins = await asyncio.gather(
        *(client.post(f"{V3}/projects", json=web, headers=ADMIN) for _ in range(2))
    )
    assert sorted(r.status_code for r in twins) == [201, 409]
    project_id = next(r for r in twins if r.status_code == 201).json()["project"]["id"]
    user = await created(client, "user", {"name": "alice", "password": "pw"})
    grant = f"{V3}/projects/{project_id}/users/{user['id']}/roles/{await role_id(client, 'member')}"
    puts = await asyncio.gather(*(client.put(grant, headers=ADMIN) for _ in range(2)))
    assert [r.status_code for r in puts] == [204, 204]
    async with db_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM role_assignments") == 1
    deletes = await asyncio.gather(*(client.delete(grant, headers=ADMIN) for _ in range(2)))
    assert sorted(r.status_code for r in deletes) == [204, 404]
    gone = await asyncio.gather(
        *(client.delete(f"{V3}/users/{user['id']}", headers=ADMIN) for _ in range(2))
    )
    assert sorted(r.status_code for r in gone) == [204, 404]


async def test_a_project_with_servers_is_not_deleted(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    project_id, user_id, token = await new_member(client, "web")
    async with db_pool.acquire() as conn:
        await instances.create(
            conn,
            instance_uuid=uuid.uuid4(),
            project_id=project_id,
            user_id=user_id,
            display_name="vm",
            flavor=FlavorSnapshot(flavorid="1", name="tiny", vcpus=1, memory_mb=64, root_gb=1),
            image_ref="",
            availability_zone=None,
        )
    refused = await client.delete(f"{V3}/projects/{project_id}", headers=ADMIN)
    assert refused.status_code == 409
    assert "1 server" in refused.json()["error"]["message"]
    assert (await client.get("/v2.1/servers", headers={"X-Auth-Token": token})).status_code == 200


async def test_keel_manage_users_are_the_api_users(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web", "admin")
    listed = await client.get(f"{V3}/role_assignments?include_names", headers=ADMIN)
    names = sorted(e["role"]["name"] for e in listed.json()["role_assignments"])
    assert names == ["admin"]
    token = await token_for(client, alice)
    shown = await client.get(
        f"{V3}/auth/tokens", headers={"X-Auth-Token": token, "X-Subject-Token": token}
    )
    assert sorted(r["name"] for r in shown.json()["token"]["roles"]) == [
        "admin",
        "manager",
        "member",
        "reader",
    ]
    async with db_pool.acquire() as conn:
        assert [u.name for u in await users.list_users(conn)] == ["alice"]


@pytest.fixture
async def through_proxy(
    settings: Settings, database_url: str, pg_proxy: TcpProxy, transport: AmqpTransport
) -> AsyncIterator[httpx.AsyncClient]:
    """keel-api whose pool reaches PostgreSQL through a proxy the test cuts."""
    pool = await create_pool(url_through(database_url, pg_proxy.address), OUTAGE_SETTINGS)
    app = create_app(settings, pool, ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http
    pool.terminate()


async def test_a_database_outage_is_503_and_leaves_nothing_half_done(
    through_proxy: httpx.AsyncClient, pg_proxy: TcpProxy
) -> None:
    client = through_proxy
    project_id, user_id, token = await new_member(client, "web")
    await pg_proxy.cut()
    attempts = [
        client.post(f"{V3}/projects", json={"project": {"name": "ops"}}, headers=ADMIN),
        client.post(f"{V3}/users", json={"user": {"name": "bob", "password": "pw"}}, headers=ADMIN),
        client.patch(f"{V3}/users/{user_id}", json={"user": {"enabled": False}}, headers=ADMIN),
        client.delete(f"{V3}/projects/{project_id}", headers=ADMIN),
        client.get("/v2.1/servers", headers={"X-Auth-Token": token}),
    ]
    for response in await asyncio.gather(*attempts):
        assert response.status_code == 503, (response.request.url, response.text)
    await pg_proxy.restore()
    names = (await client.get(f"{V3}/projects", headers=ADMIN)).json()["projects"]
    assert [p["name"] for p in names] == ["web"]
    assert (await client.get(f"{V3}/users?name=bob", headers=ADMIN)).json()["users"] == []
    assert (await client.get("/v2.1/servers", headers={"X-Auth-Token": token})).status_code == 200
    again = await client.post(f"{V3}/projects", json={"project": {"name": "ops"}}, headers=ADMIN)
    assert again.status_code == 201
