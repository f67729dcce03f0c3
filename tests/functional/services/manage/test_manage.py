"""keel-manage against a real PostgreSQL, run as operators run it: the console script."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from devkit.database import Scratch
from devkit.servers import PG_SERVER
from shared.db import services
from shared.versions import SERVICE_VERSION, release_name

pytestmark = pytest.mark.functional

KEEL_MANAGE = Path(sys.executable).parent / "keel-manage"


def manage(database_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    environ.update(KEEL_DATABASE_URL=database_url, **env)
    return subprocess.run(
        [str(KEEL_MANAGE), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
async def missing_database_url(databases: Scratch) -> AsyncIterator[str]:
    """A database name nobody has created; dropped afterwards if a test created it."""
    url = databases.unborn("manage")
    yield url
    databases.drop_soon(url)


async def test_db_sync_creates_and_migrates_then_is_idempotent(missing_database_url: str) -> None:
    first = manage(missing_database_url, "db", "sync")
    assert first.returncode == 0, first.stderr
    assert "created database" in first.stdout
    assert "applied 0001_initial" in first.stdout

    again = manage(missing_database_url, "db", "sync")
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout
    assert "applied" not in again.stdout
    assert "up to date" in again.stdout

    version = manage(missing_database_url, "db", "version")
    assert version.returncode == 0, version.stderr
    *migrations, summary = version.stdout.splitlines()
    assert all(line.endswith("applied") for line in migrations)
    assert summary.endswith(", 0 pending")

    conn = await asyncpg.connect(missing_database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM flavors") == 5
    finally:
        await conn.close()


async def test_db_version_lists_pending_migrations_of_an_empty_database(
    missing_database_url: str,
) -> None:
    admin = await asyncpg.connect(PG_SERVER)
    try:
        await admin.execute(f'CREATE DATABASE "{missing_database_url.rpartition("/")[2]}"')
    finally:
        await admin.close()
    result = manage(missing_database_url, "db", "version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].endswith("pending")
    assert "run 'keel-manage db sync'" in result.stdout


def test_commands_other_than_sync_do_not_create_the_database(missing_database_url: str) -> None:
    result = manage(missing_database_url, "service", "list")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "does not exist" in result.stderr
    assert "keel-manage db sync" in result.stderr


def test_unreachable_database_is_one_line_with_a_fix() -> None:
    result = manage("postgresql://postgres:hunter2@127.0.0.1:1/keel", "db", "sync")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "cannot reach PostgreSQL at 127.0.0.1:1" in result.stderr
    assert "KEEL_DATABASE_URL" in result.stderr
    assert "hunter2" not in result.stderr


def test_image_create_prints_the_id_and_refuses_a_duplicate(database_url: str) -> None:
    image_id = str(uuid.uuid4())
    created = manage(database_url, "image", "create", "cirros", "--id", image_id, "--min-disk", "1")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == image_id

    duplicate = manage(database_url, "image", "create", "other", "--id", image_id)
    assert duplicate.returncode == 1
    assert duplicate.stderr == f"keel-manage: Image {image_id} already exists.\n"

    listed = manage(database_url, "image", "list")
    assert listed.stdout.split()[:2] == [image_id, "cirros"]


def test_image_create_without_id_makes_one(database_url: str) -> None:
    created = manage(database_url, "image", "create", "fresh")
    assert created.returncode == 0, created.stderr
    assert uuid.UUID(created.stdout.strip())


async def test_service_list_shows_up_and_down(database_url: str, db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        alive = await services.get_or_create(
            conn, host="h1", binary="keel-compute", topic="compute", version=1, down_time=60
        )
        await services.heartbeat(conn, alive.uuid, 1)
        await services.get_or_create(
            conn, host="h2", binary="keel-compute", topic="compute", version=1, down_time=60
        )
    result = manage(database_url, "service", "list", KEEL_SERVICE_DOWN_TIME="30")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split()[:5] == ["ID", "Binary", "Host", "Status", "State"]
    assert [row.split()[1:5] for row in rows] == [
        ["keel-compute", "h1", "enabled", "up"],
        ["keel-compute", "h2", "enabled", "down"],
    ]
    only_h2 = manage(database_url, "service", "list", "--host", "h2")
    assert len(only_h2.stdout.splitlines()) == 2


def test_service_list_on_a_new_cloud_says_so(database_url: str) -> None:
    result = manage(database_url, "service", "list")
    assert result.returncode == 0
    assert result.stdout == "no services have registered yet\n"


async def test_upgrade_check_exit_codes(database_url: str, db_pool: asyncpg.Pool) -> None:
    empty = manage(database_url, "status", "upgrade-check")
    assert (empty.returncode, empty.stdout.splitlines()[-1]) == (
        0,
        f"SUCCESS: every service runs release {SERVICE_VERSION} ({release_name(SERVICE_VERSION)}).",
    )

    async with db_pool.acquire() as conn:
        for host, version in (("new", SERVICE_VERSION), ("behind", 1)):
            await services.get_or_create(
                conn,
                host=host,
                binary="keel-compute",
                topic="compute",
                version=version,
                down_time=60,
            )
    behind = manage(database_url, "status", "upgrade-check")
    assert behind.returncode == 1, behind.stdout
    assert "keel-compute  1 (arbor)" in behind.stdout
    assert "WARNING: not yet on the latest release" in behind.stdout
    assert "keel-compute on behind (v1)" in behind.stdout

    async with db_pool.acquire() as conn:
        await services.get_or_create(
            conn, host="ancient", binary="keel-compute", topic="compute", version=0, down_time=60
        )
    ancient = manage(database_url, "status", "upgrade-check")
    assert ancient.returncode == 2, ancient.stdout
    assert "FAILURE: older than this release supports (v1): keel-compute on ancient (v0)" in (
        ancient.stdout
    )

    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET forced_down = true WHERE host <> 'new'")
    settled = manage(database_url, "status", "upgrade-check")
    assert settled.returncode == 0, settled.stdout
