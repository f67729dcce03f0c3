"""keel-manage project and user commands, run as the console script against PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import uuid

import asyncpg
import pytest

from shared.db import instances
from shared.objects.flavor import FlavorSnapshot
from shared.passwords import verify_password
from tests.functional.services.manage.test_manage import KEEL_MANAGE

pytestmark = pytest.mark.functional


def run(database_url: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    environ["KEEL_DATABASE_URL"] = database_url
    return subprocess.run(
        [str(KEEL_MANAGE), *args],
        env=environ,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ok(database_url: str, *args: str, stdin: str = "") -> str:
    result = run(database_url, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


async def stored_hash(database_url: str, name: str) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        found: str = await conn.fetchval("SELECT password_hash FROM users WHERE name = $1", name)
    finally:
        await conn.close()
    return found


async def test_project_create_prints_the_id_and_refuses_duplicates(database_url: str) -> None:
    project_id = ok(database_url, "project", "create", "web", "--description", "the web team")
    assert len(project_id) == 32
    assert int(project_id, 16) >= 0
    again = run(database_url, "project", "create", "web")
    assert again.returncode == 1
    assert "already exists" in again.stderr
    listed = ok(database_url, "project", "list")
    assert project_id in listed
    assert "the web team" in listed
    bad = run(database_url, "project", "create", " spaced ")
    assert bad.returncode == 2


async def test_user_password_from_stdin_or_option_is_stored_hashed(database_url: str) -> None:
    ok(database_url, "project", "create", "web")
    alice = ok(database_url, "user", "create", "alice", "--project", "web", stdin="s3cret pass\n")
    bob = ok(
        database_url, "user", "create", "bob", "--project", "web", "--role", "admin",
        "--password", "hunter2",
    )  # fmt: skip
    assert len(alice) == len(bob) == 32
    alice_hash = await stored_hash(database_url, "alice")
    assert "s3cret" not in alice_hash
    assert verify_password("s3cret pass", alice_hash)
    assert verify_password("hunter2", await stored_hash(database_url, "bob"))
    listed = ok(database_url, "user", "list", "--project", "web")
    assert [line.split()[1:] for line in listed.splitlines()[1:]] == [
        ["alice", "web", "member"],
        ["bob", "web", "admin"],
    ]
    ok(database_url, "user", "set-password", "alice", stdin="another\n")
    assert verify_password("another", await stored_hash(database_url, "alice"))


@pytest.mark.parametrize(
    ("args", "stdin", "code", "says"),
    [
        (("user", "create", "carol", "--project", "web"), "", 2, "password is empty"),
        (("user", "create", "carol", "--project", "web"), "\n", 2, "password is empty"),
        (("user", "create", "carol", "--project", "nowhere", "--password", "x"), "", 1, "nowhere"),
        (("user", "create", "alice", "--project", "web", "--password", "x"), "", 1, "exists"),
        (("user", "create", "dave", "--project", "web", "--role", "king"), "x\n", 1, "king"),
        (("user", "delete", "nobody"), "", 1, "nobody"),
        (("project", "delete", "nowhere"), "", 1, "nowhere"),
    ],
)
async def test_failures_exit_with_one_line(
    database_url: str, args: tuple[str, ...], stdin: str, code: int, says: str
) -> None:
    ok(database_url, "project", "create", "web")
    ok(database_url, "user", "create", "alice", "--project", "web", "--password", "pw")
    result = run(database_url, *args, stdin=stdin)
    assert result.returncode == code, result.stderr
    assert says in result.stderr
    assert result.stdout == ""


async def test_project_delete_waits_for_its_servers_and_takes_its_roles(
    database_url: str, db_pool: asyncpg.Pool
) -> None:
    project_id = ok(database_url, "project", "create", "web")
    ok(database_url, "user", "create", "alice", "--project", project_id, "--password", "pw")
    async with db_pool.acquire() as conn:
        await instances.create(
            conn,
            instance_uuid=uuid.uuid4(),
            project_id=project_id,
            user_id="someone",
            display_name="vm",
            flavor=FlavorSnapshot(flavorid="1", name="tiny", vcpus=1, memory_mb=64, root_gb=1),
            image_ref="",
            availability_zone=None,
        )
    busy = run(database_url, "project", "delete", project_id)
    assert busy.returncode == 1
    assert "1 server" in busy.stderr
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE instances SET deleted_at = now()")
    assert "deleted project web" in ok(database_url, "project", "delete", "web")
    assert "no projects yet" in ok(database_url, "project", "list")
    assert "no users yet" in ok(database_url, "user", "list")
    async with db_pool.acquire() as conn:
        kept = await conn.fetchrow("SELECT name, default_project_id FROM users")
    assert dict(kept or {}) == {"name": "alice", "default_project_id": None}
