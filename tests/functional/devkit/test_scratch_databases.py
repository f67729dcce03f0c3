"""Scratch databases: migrated copies of one template, and what crashed runs left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import asyncpg
import pytest

from devkit.database import scratch
from devkit.environment import with_devkit
from devkit.readiness import wait_until
from devkit.servers import PG_SERVER
from services.manage.database import database_name, with_database
from shared.db import schema

pytestmark = pytest.mark.functional


async def exists(name: str) -> bool:
    admin = await asyncpg.connect(PG_SERVER)
    try:
        return bool(await admin.fetchval("SELECT true FROM pg_database WHERE datname = $1", name))
    finally:
        await admin.close()


#: A run killed after making two databases: it prints their names, then SIGKILLs itself.
CRASHING_RUN = """
import asyncio, os, signal, sys
from devkit.database import Scratch
from services.manage.database import database_name

async def main() -> None:
    run = await Scratch.open(sys.argv[1])
    print(database_name(await run.migrated("test")), database_name(await run.empty("bench")))
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def crashed_run() -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", CRASHING_RUN, PG_SERVER],
        env=with_devkit(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    return result.stdout.split()


async def test_a_copy_is_fully_migrated_and_the_template_takes_no_connections() -> None:
    async with scratch(PG_SERVER) as run:
        url = await run.migrated("test")
        again = await run.migrated("test")
        assert url != again
        conn = await asyncpg.connect(url)
        try:
            assert await schema.pending(conn) == []
            await conn.execute("DELETE FROM flavors")
        finally:
            await conn.close()
        conn = await asyncpg.connect(again)
        try:
            assert await conn.fetchval("SELECT count(*) FROM flavors") == 5
            template = await conn.fetchval(
                """SELECT datname FROM pg_database
                    WHERE datname LIKE 'keel\\_template\\_' || $1 || '\\_%'""",
                str(run.run_id),
            )
        finally:
            await conn.close()
        with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError):
            await asyncpg.connect(with_database(PG_SERVER, template))
    assert not await exists(database_name(url))
    assert not await exists(template)


async def test_a_crashed_runs_databases_go_and_a_live_runs_stay() -> None:
    async with scratch(PG_SERVER) as live:
        kept = database_name(await live.migrated("test"))
        left = crashed_run()
        assert len(left) == 2
        for name in left:
            assert await exists(name)
        async with scratch(PG_SERVER):
            for name in left:
                assert not await exists(name)
            assert await exists(kept)
    assert not await exists(kept)


async def test_a_database_dropped_soon_goes_while_the_run_goes_on() -> None:
    async with scratch(PG_SERVER) as run:
        first = await run.migrated("test")
        conn = await asyncpg.connect(first)  # a test that left a connection open
        run.drop_soon(first)
        second = await run.migrated("test")

        async def gone() -> bool:
            return not await exists(database_name(first))

        await wait_until(gone, what="the background drop", timeout=30)
        assert await exists(database_name(second))
        conn.terminate()
        run.drop_soon(second)
    assert not await exists(database_name(second))
