"""The operator's page's door: who gets in, how the session is kept, what CSRF refuses.

keel-api in-process against real PostgreSQL and RabbitMQ; users made in the database
with keel's own password hashing.
"""

from __future__ import annotations

import asyncio
import re

import asyncpg
import httpx
import pytest

from services.api.ops.session import SESSION_COOKIE, csrf_token
from shared.config import OpsSettings, Settings
from shared.db import users
from shared.objects.identity import ADMIN_ROLE, MEMBER_ROLE
from shared.passwords import hash_password
from tests.functional.services.api.conftest import ADMIN, MEMBER, add_compute
from tests.functional.services.api.identity_fixtures import Person, add_person

pytestmark = pytest.mark.functional

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
DATA_ROUTES = ("/ops/api/hosts", "/ops/api/moves", "/ops/api/versions", "/ops/api/events")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"ops": OpsSettings(session_lifetime=900)})


@pytest.fixture
async def admin(db_pool: asyncpg.Pool) -> Person:
    return await add_person(db_pool, "opsadmin", "ops-project", ADMIN_ROLE)


@pytest.fixture
async def member(db_pool: asyncpg.Pool) -> Person:
    return await add_person(db_pool, "opsmember", "ops-project", MEMBER_ROLE)


async def sign_in(client: httpx.AsyncClient, name: str, password: str) -> httpx.Response:
    return await client.post(
        "/ops/login", headers=FORM, content=f"username={name}&password={password}"
    )


def cookie(session: str) -> dict[str, str]:
    """Request headers carrying the session cookie, as the browser sends it."""
    return {"Cookie": f"{SESSION_COOKIE}={session}"}


def session_of(response: httpx.Response) -> str:
    found = re.search(rf"{SESSION_COOKIE}=([^;]+)", response.headers.get("set-cookie", ""))
    assert found is not None, response.headers
    return found[1]


async def test_anyone_not_signed_in_gets_the_form_and_no_data(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "secret-host-name")
    page = await client.get("/ops/")
    assert page.status_code == 200
    assert 'name="password"' in page.text
    assert "secret-host-name" not in page.text
    assert "csrf-token" not in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    for route in DATA_ROUTES:
        refused = await client.get(route)
        assert refused.status_code == 401, route
        assert "secret-host-name" not in refused.text
        assert refused.headers["x-frame-options"] == "DENY"
    assert (await client.get("/ops/api/hosts", headers=MEMBER)).status_code == 403
    assert (await client.get("/ops/", headers=MEMBER)).text == page.text
    bare = await client.get("/ops")
    assert bare.status_code == 308
    assert bare.headers["location"] == "/ops/"


async def test_scripts_read_the_data_with_an_admin_token(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "scripted")
    answer = await client.get("/ops/api/hosts", headers=ADMIN)
    assert answer.status_code == 200
    assert [h["host"] for h in answer.json()["hosts"]] == ["scripted"]


async def test_an_admin_signs_in_with_a_strict_secure_cookie(
    client: httpx.AsyncClient, admin: Person
) -> None:
    answer = await sign_in(client, admin.name, admin.password)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ops/"
    set_cookie = answer.headers["set-cookie"]
    for attribute in ("HttpOnly", "Secure", "SameSite=strict", "Path=/ops", "Max-Age=900"):
        assert attribute.lower() in set_cookie.lower(), set_cookie
    session = session_of(answer)
    assert len(session) >= 40

    page = await client.get("/ops/", headers=cookie(session))
    assert page.status_code == 200
    assert f'content="{csrf_token(session)}"' in page.text
    assert admin.name in page.text
    data = await client.get("/ops/api/hosts", headers=cookie(session))
    assert data.status_code == 200


@pytest.mark.parametrize("who", ["member", "wrong password", "nobody"])
async def test_anyone_else_is_refused_alike_and_gets_no_session(
    client: httpx.AsyncClient, admin: Person, member: Person, who: str
) -> None:
    name, password = {
        "member": (member.name, member.password),
        "wrong password": (admin.name, "not-it"),
        "nobody": ("nobody", "whatever"),
    }[who]
    refused = await sign_in(client, name, password)
    assert refused.status_code == 403
    assert "set-cookie" not in refused.headers
    assert "Sign-in refused: unknown user, wrong password, or not an admin." in refused.text
    assert 'name="password"' in refused.text


async def test_a_session_cookie_that_is_not_valid_shows_the_form(
    client: httpx.AsyncClient,
) -> None:
    forged = cookie("x" * 43)
    assert 'name="password"' in (await client.get("/ops/", headers=forged)).text
    assert (await client.get("/ops/api/hosts", headers=forged)).status_code == 401
    huge = cookie("y" * 5000)
    assert (await client.get("/ops/api/hosts", headers=huge)).status_code == 401


async def test_changes_with_a_session_need_the_csrf_token_and_this_origin(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, admin: Person
) -> None:
    service, _ = await add_compute(db_pool, "guarded")
    session = session_of(await sign_in(client, admin.name, admin.password))
    cookies = cookie(session)
    path = f"/ops/api/hosts/{service.uuid}/disable"
    body = {"reason": "maintenance"}

    missing = await client.post(path, json=body, headers=cookies)
    assert missing.status_code == 403
    wrong = await client.post(path, json=body, headers={**cookies, "X-CSRF-Token": "nope"})
    assert wrong.status_code == 403
    token = {**cookies, "X-CSRF-Token": csrf_token(session)}
    elsewhere = await client.post(
        path, json=body, headers={**token, "Origin": "https://evil.example"}
    )
    assert elsewhere.status_code == 403
    hosts = (await client.get("/ops/api/hosts", headers=ADMIN)).json()["hosts"]
    assert hosts[0]["disabled"] is False

    same = {**token, "Origin": "http://keel.test"}
    done = await client.post(path, json=body, headers=same)
    assert done.status_code == 200, done.text
    assert done.json() == {
        "host": "guarded",
        "disabled": True,
        "disabled_reason": "maintenance",
        "forced_down": False,
    }


async def test_signing_out_ends_the_session_for_good(
    client: httpx.AsyncClient, admin: Person
) -> None:
    session = session_of(await sign_in(client, admin.name, admin.password))
    form = {**FORM, **cookie(session)}
    ignored = await client.post("/ops/logout", headers=form, content="csrf_token=wrong")
    assert ignored.status_code == 303
    assert (await client.get("/ops/api/hosts", headers=cookie(session))).status_code == 200

    out = await client.post(
        "/ops/logout", headers=form, content=f"csrf_token={csrf_token(session)}"
    )
    assert out.status_code == 303
    assert f'{SESSION_COOKIE}=""' in out.headers["set-cookie"]
    assert (await client.get("/ops/api/hosts", headers=cookie(session))).status_code == 401


async def test_a_session_ends_when_the_password_changes(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, admin: Person
) -> None:
    session = session_of(await sign_in(client, admin.name, admin.password))
    async with db_pool.acquire() as conn:
        user = await users.get(conn, admin.user_id)
        await users.set_password(conn, user, hash_password("a-new-one"))
    assert (await client.get("/ops/api/hosts", headers=cookie(session))).status_code == 401


async def test_two_sign_ins_at_once_get_two_sessions(
    client: httpx.AsyncClient, admin: Person
) -> None:
    answers = await asyncio.gather(*(sign_in(client, admin.name, admin.password) for _ in range(2)))
    sessions = {session_of(answer) for answer in answers}
    assert len(sessions) == 2
    for session in sessions:
        got = await client.get("/ops/api/events", headers=cookie(session))
        assert got.status_code == 200


async def test_a_form_that_is_not_a_form_is_a_400(client: httpx.AsyncClient) -> None:
    answer = await client.post("/ops/login", json={"username": "a", "password": "b"})
    assert answer.status_code == 400
    assert "x-www-form-urlencoded" in answer.json()["badRequest"]["message"]


async def test_the_static_files_and_nothing_else(client: httpx.AsyncClient) -> None:
    script = await client.get("/ops/static/ops.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert "X-CSRF-Token" in script.text
    assert (await client.get("/ops/static/ops.css")).status_code == 200
    assert (await client.get("/ops/static/..%2Fsession.py")).status_code == 404
    assert (await client.get("/ops/static/nothing.js")).status_code == 404
