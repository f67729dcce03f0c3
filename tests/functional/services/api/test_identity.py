"""The identity API: password tokens, their catalog, validation, expiry and look-ups."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from shared.db import users
from shared.objects.identity import ADMIN_ROLE
from tests.functional.services.api.conftest import ADMIN, MEMBER
from tests.functional.services.api.identity_fixtures import (
    add_person,
    password_body,
    token_for,
)

pytestmark = pytest.mark.functional


async def test_discovery_documents_need_no_token(client: httpx.AsyncClient) -> None:
    listed = await client.get("/identity")
    assert listed.status_code == 200
    [version] = listed.json()["versions"]["values"]
    assert version["id"].startswith("v3.")
    assert version["links"][0]["href"] == "http://keel.test/identity/v3/"
    for path in ("/identity/v3", "/identity/v3/"):
        shown = await client.get(path)
        assert shown.status_code == 200
        assert shown.json()["version"]["status"] == "stable"


async def test_password_token_names_user_project_roles_and_catalog(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    for by_id in (False, True):
        response = await client.post(
            "/identity/v3/auth/tokens", json=password_body(alice, by_id=by_id)
        )
        assert response.status_code == 201, response.text
        assert len(response.headers["X-Subject-Token"]) >= 40
        token = response.json()["token"]
        assert token["user"]["id"] == alice.user_id
        assert token["project"] == {
            "id": alice.project_id,
            "name": "web",
            "domain": {"id": "default", "name": "Default"},
        }
        assert sorted(r["name"] for r in token["roles"]) == ["member", "reader"]
        assert token["expires_at"].endswith("Z")
        catalog = {entry["type"]: entry["endpoints"] for entry in token["catalog"]}
        assert set(catalog) == {"compute", "image", "identity", "network"}
        compute = {e["interface"]: e["url"] for e in catalog["compute"]}
        assert compute == dict.fromkeys(("public", "internal", "admin"), "http://keel.test/v2.1/")
        assert {e["url"] for e in catalog["image"]} == {"http://keel.test/image/"}
        assert {e["region_id"] for e in catalog["identity"]} == {"RegionOne"}


async def test_issued_tokens_authenticate_compute_routes_with_their_roles(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    boss = await add_person(db_pool, "boss", "ops", ADMIN_ROLE)
    member = {"X-Auth-Token": await token_for(client, alice)}
    admin = {"X-Auth-Token": await token_for(client, boss)}
    assert (await client.get("/v2.1/servers", headers=member)).status_code == 200
    assert (await client.get("/v2.1/os-hypervisors", headers=member)).status_code == 403
    assert (await client.get("/v2.1/os-hypervisors", headers=admin)).status_code == 200
    assert (await client.get("/v2.1/servers", headers=ADMIN)).status_code == 200


@pytest.mark.parametrize(
    "change",
    ["wrong password", "unknown user", "other project", "other domain", "no password"],
)
async def test_every_failure_to_authenticate_is_401(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, change: str
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    await add_person(db_pool, "bob", "elsewhere")
    body = password_body(alice)
    auth = body["auth"]
    assert isinstance(auth, dict)
    user = auth["identity"]["password"]["user"]
    if change == "wrong password":
        user["password"] = "not-it"
    elif change == "unknown user":
        user["name"] = "mallory"
    elif change == "other project":
        auth["scope"] = {"project": {"name": "elsewhere", "domain": {"id": "default"}}}
    elif change == "other domain":
        user["domain"] = {"name": "Elsewhere"}
    else:
        auth["identity"] = {"methods": ["token"], "token": {"id": "x"}}
    response = await client.post("/identity/v3/auth/tokens", json=body)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == 401
    assert "X-Subject-Token" not in response.headers


async def test_without_a_scope_the_token_is_for_the_default_project(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    body = password_body(alice)
    auth = body["auth"]
    assert isinstance(auth, dict)
    del auth["scope"]
    response = await client.post("/identity/v3/auth/tokens", json=body)
    assert response.status_code == 201
    assert response.json()["token"]["project"]["id"] == alice.project_id


async def test_malformed_body_is_an_identity_shaped_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/identity/v3/auth/tokens", json={"auth": "password"})
    assert response.status_code == 400
    assert response.json()["error"]["title"] == "Bad Request"


async def test_expired_token_is_refused_everywhere(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    token = await token_for(client, alice)
    headers = {"X-Auth-Token": token}
    assert (await client.get("/v2.1/servers", headers=headers)).status_code == 200
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE identity_tokens SET expires_at = now() - interval '1 second'")
    assert (await client.get("/v2.1/servers", headers=headers)).status_code == 401
    check = await client.get(
        "/identity/v3/auth/tokens", headers={**ADMIN, "X-Subject-Token": token}
    )
    assert check.status_code == 404


async def test_tokens_expire_after_the_configured_time(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    await token_for(client, alice)
    async with db_pool.acquire() as conn:
        lifetime = await conn.fetchval(
            "SELECT extract(epoch FROM expires_at - issued_at) FROM identity_tokens"
        )
    assert 3590 <= float(lifetime) <= 3610


async def test_validate_and_revoke(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    alice = await add_person(db_pool, "alice", "web")
    token = await token_for(client, alice)
    own = {"X-Auth-Token": token, "X-Subject-Token": token}
    shown = await client.get("/identity/v3/auth/tokens", headers=own)
    assert shown.status_code == 200
    assert shown.headers["X-Subject-Token"] == token
    assert shown.json()["token"]["user"]["name"] == "alice"
    other = await client.get(
        "/identity/v3/auth/tokens", headers={**MEMBER, "X-Subject-Token": token}
    )
    assert other.status_code == 403
    assert (await client.head("/identity/v3/auth/tokens", headers=own)).status_code == 200
    assert (await client.delete("/identity/v3/auth/tokens", headers=own)).status_code == 204
    assert (await client.get("/v2.1/servers", headers={"X-Auth-Token": token})).status_code == 401


async def test_deleting_a_user_or_changing_the_password_revokes_tokens(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    bob = await add_person(db_pool, "bob", "web")
    alice_token, bob_token = await token_for(client, alice), await token_for(client, bob)
    async with db_pool.acquire() as conn:
        await users.delete(conn, await users.get(conn, alice.user_id))
        await users.set_password(conn, await users.get(conn, bob.user_id), "scrypt$x")
    for token in (alice_token, bob_token):
        response = await client.get("/v2.1/servers", headers={"X-Auth-Token": token})
        assert response.status_code == 401


async def test_stored_secrets_are_hashed(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    alice = await add_person(db_pool, "alice", "web", password="correct horse")
    token = await token_for(client, alice)
    async with db_pool.acquire() as conn:
        stored = await conn.fetchval("SELECT password_hash FROM users")
        token_hashes = await conn.fetch("SELECT token_hash FROM identity_tokens")
    assert "correct horse" not in stored
    assert stored.startswith("scrypt$")
    assert all(token.encode() not in bytes(row["token_hash"]) for row in token_hashes)


async def test_admins_see_every_project_and_user(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    await add_person(db_pool, "bob", "ops")
    projects = await client.get("/identity/v3/projects", headers=ADMIN)
    assert sorted(p["name"] for p in projects.json()["projects"]) == ["ops", "web"]
    named = await client.get("/identity/v3/projects", params={"name": "web"}, headers=ADMIN)
    assert [p["id"] for p in named.json()["projects"]] == [alice.project_id]
    one = await client.get(f"/identity/v3/projects/{alice.project_id}", headers=ADMIN)
    assert one.json()["project"]["name"] == "web"
    people = await client.get("/identity/v3/users", params={"name": "alice"}, headers=ADMIN)
    assert [u["id"] for u in people.json()["users"]] == [alice.user_id]
    missing = await client.get("/identity/v3/projects/nope", headers=ADMIN)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == 404


async def test_members_see_only_their_own_project_and_themselves(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    bob = await add_person(db_pool, "bob", "ops")
    headers = {"X-Auth-Token": await token_for(client, alice)}
    listed = await client.get("/identity/v3/projects", headers=headers)
    assert [p["id"] for p in listed.json()["projects"]] == [alice.project_id]
    other = await client.get(f"/identity/v3/projects/{bob.project_id}", headers=headers)
    assert other.status_code == 403
    own = await client.get(f"/identity/v3/projects/{alice.project_id}", headers=headers)
    assert own.status_code == 200
    users_seen = await client.get("/identity/v3/users", headers=headers)
    assert [u["name"] for u in users_seen.json()["users"]] == ["alice"]
    mine = await client.get(f"/identity/v3/users/{alice.user_id}/projects", headers=headers)
    assert [p["name"] for p in mine.json()["projects"]] == ["web"]
    assert (
        await client.get(f"/identity/v3/users/{bob.user_id}", headers=headers)
    ).status_code == 403
