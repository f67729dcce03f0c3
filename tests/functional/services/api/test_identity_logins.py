"""Repeated logins are cheap, and nothing a login or a token stood for outlives a change.

keel-api remembers passwords it verified (as keyed digests) so a repeated login skips
scrypt; these tests check, through two keel-apis on one database (as behind a load
balancer), that a password change, a disabled or deleted user, or a revoked token is
refused at once by both, whichever one made the change or remembered the password, and
by a change made in the database directly (as ``keel-manage user`` makes it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.db import users
from shared.passwords import hash_password
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.api.conftest import ADMIN
from tests.functional.services.api.identity_fixtures import (
    Person,
    add_person,
    password_body,
    token_for,
)

pytestmark = pytest.mark.functional

V3 = "/identity/v3"
TOKENS = f"{V3}/auth/tokens"


@pytest.fixture
async def other_api(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> AsyncIterator[httpx.AsyncClient]:
    """A second keel-api on the same database, with its own remembered passwords."""
    app = create_app(settings, db_pool, ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http


async def login(client: httpx.AsyncClient, person: Person, password: str | None = None) -> int:
    response = await client.post(TOKENS, json=password_body(person, password=password))
    return response.status_code


async def servers_status(client: httpx.AsyncClient, token: str) -> int:
    return (await client.get("/v2.1/servers", headers={"X-Auth-Token": token})).status_code


def without_token_fields(body: dict[str, Any]) -> dict[str, Any]:
    token = dict(body["token"])
    for field in ("audit_ids", "issued_at", "expires_at"):
        token.pop(field)
    return token


async def test_a_repeated_login_answers_as_the_first(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    first = await client.post(TOKENS, json=password_body(alice))
    again = await client.post(TOKENS, json=password_body(alice))
    by_id = await client.post(TOKENS, json=password_body(alice, by_id=True))
    assert [r.status_code for r in (first, again, by_id)] == [201, 201, 201]
    assert without_token_fields(first.json()) == without_token_fields(again.json())
    assert without_token_fields(by_id.json()) == without_token_fields(first.json())
    tokens = {r.headers["X-Subject-Token"] for r in (first, again, by_id)}
    assert len(tokens) == 3
    for token in tokens:
        assert await servers_status(client, token) == 200
    # The wrong password, after the right one was remembered, is still refused.
    assert await login(client, alice, "not-" + alice.password) == 401
    assert await login(client, alice, alice.password[:-1]) == 401


async def test_two_logins_at_once_both_get_a_token(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    statuses = await asyncio.gather(*(login(client, alice) for _ in range(2)))
    assert statuses == [201, 201]
    wrong_and_right = await asyncio.gather(
        login(client, alice, "wrong"), login(client, alice), login(client, alice, "wrong")
    )
    assert list(wrong_and_right) == [401, 201, 401]


@pytest.mark.parametrize("where", ["same keel-api", "other keel-api", "database"])
async def test_a_changed_password_refuses_the_old_one_at_once(
    client: httpx.AsyncClient,
    other_api: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    where: str,
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    for api in (client, other_api):
        assert await login(api, alice) == 201
        assert await login(api, alice) == 201
    if where == "database":
        async with db_pool.acquire() as conn:
            found = await users.get(conn, alice.user_id)
            await users.set_password(conn, found, hash_password("brand-new"))
    else:
        api = client if where == "same keel-api" else other_api
        patch = {"user": {"password": "brand-new"}}
        changed = await api.patch(f"{V3}/users/{alice.user_id}", json=patch, headers=ADMIN)
        assert changed.status_code == 200, changed.text
    for api in (client, other_api):
        assert await login(api, alice) == 401
        assert await login(api, alice, "brand-new") == 201


async def test_a_password_changed_by_its_owner_refuses_the_old_one_at_once(
    client: httpx.AsyncClient, other_api: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    assert await login(other_api, alice) == 201
    change = {"user": {"password": "brand-new", "original_password": alice.password}}
    changed = await client.post(f"{V3}/users/{alice.user_id}/password", json=change)
    assert changed.status_code == 204
    # The original password, remembered by both, no longer proves anything.
    again = await client.post(f"{V3}/users/{alice.user_id}/password", json=change)
    assert again.status_code == 401
    for api in (client, other_api):
        assert await login(api, alice) == 401
        assert await login(api, alice, "brand-new") == 201


async def test_a_disabled_user_cannot_log_in_at_once(
    client: httpx.AsyncClient, other_api: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    for api in (client, other_api):
        assert await login(api, alice) == 201
    off = await client.patch(
        f"{V3}/users/{alice.user_id}", json={"user": {"enabled": False}}, headers=ADMIN
    )
    assert off.status_code == 200
    for api in (client, other_api):
        assert await login(api, alice) == 401
    on = await other_api.patch(
        f"{V3}/users/{alice.user_id}", json={"user": {"enabled": True}}, headers=ADMIN
    )
    assert on.status_code == 200
    for api in (client, other_api):
        assert await login(api, alice) == 201


async def test_a_deleted_user_cannot_log_in_at_once_nor_a_namesake(
    client: httpx.AsyncClient, other_api: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    for api in (client, other_api):
        assert await login(api, alice) == 201
    deleted = await client.delete(f"{V3}/users/{alice.user_id}", headers=ADMIN)
    assert deleted.status_code == 204
    for api in (client, other_api):
        assert await login(api, alice) == 401
    # A new user of the same name, whatever their password, is someone else.
    namesake = await add_person(db_pool, "alice", "web", password=alice.password)
    assert namesake.user_id != alice.user_id
    assert await login(other_api, namesake) == 201
    old = await other_api.post(TOKENS, json=password_body(alice, by_id=True))
    assert old.status_code == 401  # by the old id: that user is gone


async def test_a_revoked_token_fails_at_once_on_every_keel_api(
    client: httpx.AsyncClient, other_api: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    token = await token_for(client, alice)
    kept = await token_for(client, alice)
    for api in (client, other_api):
        for _ in range(2):
            assert await servers_status(api, token) == 200
    own = {"X-Auth-Token": token, "X-Subject-Token": token}
    assert (await other_api.delete(TOKENS, headers=own)).status_code == 204
    for api in (client, other_api):
        assert await servers_status(api, token) == 401
        assert (
            await api.get(TOKENS, headers={**ADMIN, "X-Subject-Token": token})
        ).status_code == 404
        assert await servers_status(api, kept) == 200
    # Revoking it again (a retried request) finds nothing to revoke.
    again = await client.delete(TOKENS, headers={**ADMIN, "X-Subject-Token": token})
    assert again.status_code == 404


async def test_a_token_check_sees_a_lost_role_at_once(
    client: httpx.AsyncClient, other_api: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    alice = await add_person(db_pool, "alice", "web")
    token = await token_for(client, alice)
    assert await servers_status(other_api, token) == 200
    roles = (await client.get(f"{V3}/roles?name=member", headers=ADMIN)).json()["roles"]
    grant = f"{V3}/projects/{alice.project_id}/users/{alice.user_id}/roles/{roles[0]['id']}"
    assert (await client.delete(grant, headers=ADMIN)).status_code == 204
    for api in (client, other_api):
        assert await servers_status(api, token) == 401
        assert await login(api, alice) == 401
