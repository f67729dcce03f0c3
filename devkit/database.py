"""Scratch databases for tests and benchmarks, copied from one migrated template.

A run (a pytest session, a benchmark) opens a :class:`Scratch` on a server. It keeps one
connection to the server's maintenance database for the whole run and holds on it a
session-level advisory lock on the run's id; every database the run creates is named
``keel_<kind>_<run id>_<random>``. When a run opens, the databases of runs whose lock
nobody holds any more (they crashed or were killed) are dropped.

:meth:`Scratch.migrated` migrates a template database once, on first use, and then
copies it (``CREATE DATABASE ... TEMPLATE``): a copy takes a fraction of a second where
creating and migrating takes about one. PostgreSQL copies a database only while nobody
is connected to it, so the template refuses connections once migrated. A drop waits for
the server's disk; :meth:`Scratch.drop_soon` leaves it to a connection of its own while
the run goes on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from services.manage.database import database_name, with_database
from shared.db import schema

LOG = logging.getLogger(__name__)

#: The first key of the advisory lock a run holds (the second is the run's id).
RUN_LOCK_CLASS = 0x6B64  # "kd"
#: ``keel_<kind>_<run id>_<random>``.
_KIND = r"[a-z][a-z0-9]*"
_SCRATCH_NAME = re.compile(rf"^keel_{_KIND}_(\d+)_[0-9a-f]{{8}}$")


def quoted(name: str) -> str:
    """``name`` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


class Scratch:
    """The scratch databases of one run on one server; see the module's text."""

    def __init__(self, server: str, admin: asyncpg.Connection, run_id: int) -> None:
        self.server = server
        self.run_id = run_id
        self._admin = admin
        #: One statement at a time on the admin connection.
        self._lock = asyncio.Lock()
        self._template: str | None = None
        self._created: set[str] = set()
        #: Drops under way in the background, on a connection of their own.
        self._dropping: set[asyncio.Task[None]] = set()
        self._dropper: asyncpg.Connection | None = None
        self._dropper_lock = asyncio.Lock()

    @classmethod
    async def open(cls, server: str) -> Scratch:
        """Take a run id on ``server`` and drop what crashed runs left there."""
        admin = await asyncpg.connect(server)
        try:
            while True:
                run_id = secrets.randbelow(2**31 - 1) + 1
                if await admin.fetchval(
                    "SELECT pg_try_advisory_lock($1, $2)", RUN_LOCK_CLASS, run_id
                ):
                    break
            scratch = cls(server, admin, run_id)
            await scratch.drop_leftovers()
        except BaseException:
            await admin.close()
            raise
        return scratch

    def _new_name(self, kind: str) -> str:
        if not re.fullmatch(_KIND, kind):
            raise ValueError(f"a scratch database kind is a lower-case word, not {kind!r}")
        return f"keel_{kind}_{self.run_id}_{uuid.uuid4().hex[:8]}"

    async def empty(self, kind: str) -> str:
        """A new database without any table: its URL."""
        name = self._new_name(kind)
        async with self._lock:
            await self._admin.execute(f"CREATE DATABASE {quoted(name)}")
        self._created.add(name)
        return with_database(self.server, name)

    def unborn(self, kind: str) -> str:
        """The URL of a database of this run that does not exist yet (something else is to
        create it); dropped with the run's others if it was."""
        name = self._new_name(kind)
        self._created.add(name)
        return with_database(self.server, name)

    async def migrated(self, kind: str) -> str:
        """A new database with every schema migration applied: its URL."""
        template = await self._migrated_template()
        name = self._new_name(kind)
        async with self._lock:
            await self._admin.execute(f"CREATE DATABASE {quoted(name)} TEMPLATE {quoted(template)}")
        self._created.add(name)
        return with_database(self.server, name)

    async def _migrated_template(self) -> str:
        if self._template is None:
            url = await self.empty("template")
            conn = await asyncpg.connect(url)
            try:
                await schema.sync(conn)
            finally:
                await conn.close()
            name = database_name(url)
            async with self._lock:
                await self._admin.execute(
                    f"ALTER DATABASE {quoted(name)} WITH ALLOW_CONNECTIONS false"
                )
            self._template = name
        return self._template

    async def drop(self, url: str) -> None:
        """Drop the database ``url`` names, whoever is still connected to it."""
        name = database_name(url)
        async with self._lock:
            await self._admin.execute(f"DROP DATABASE IF EXISTS {quoted(name)} WITH (FORCE)")
        self._created.discard(name)
        if name == self._template:
            self._template = None

    def drop_soon(self, url: str) -> None:
        """Drop the database ``url`` names in the background; :meth:`close` waits for it."""
        task = asyncio.get_running_loop().create_task(self._drop_in_background(url))
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

    async def _drop_in_background(self, url: str) -> None:
        name = database_name(url)
        try:
            async with self._dropper_lock:
                if self._dropper is None:
                    self._dropper = await asyncpg.connect(self.server)
                await self._dropper.execute(f"DROP DATABASE IF EXISTS {quoted(name)} WITH (FORCE)")
        except (OSError, asyncpg.PostgresError) as exc:
            LOG.warning("dropping %s failed (%s); the run's end tries again", name, exc)
            return
        self._created.discard(name)

    async def drop_leftovers(self) -> list[str]:
        """Drop the scratch databases of runs that hold their lock no more; their names."""
        async with self._lock:
            rows = await self._admin.fetch(
                """SELECT datname FROM pg_database
                    WHERE datname ~ $1""",
                _SCRATCH_NAME.pattern,
            )
            held = {
                row["objid"]
                for row in await self._admin.fetch(
                    """SELECT objid::bigint FROM pg_locks
                        WHERE locktype = 'advisory' AND classid = $1 AND granted""",
                    RUN_LOCK_CLASS,
                )
            }
        dropped = []
        for row in rows:
            match = _SCRATCH_NAME.match(row["datname"])
            if match is None or int(match[1]) in held:
                continue
            try:
                await self.drop(with_database(self.server, row["datname"]))
            except (asyncpg.InvalidCatalogNameError, asyncpg.ObjectInUseError):
                continue  # another run is dropping it at the same time
            dropped.append(row["datname"])
        if dropped:
            LOG.info("dropped %d databases of runs that ended without them", len(dropped))
        return dropped

    async def close(self) -> None:
        """Drop every database of this run, the template last, and end the run."""
        try:
            await asyncio.gather(*self._dropping, return_exceptions=True)
            for name in sorted(self._created, key=lambda n: n == self._template):
                await self.drop(with_database(self.server, name))
        finally:
            if self._dropper is not None:
                await self._dropper.close()
            await self._admin.close()


@asynccontextmanager
async def scratch(server: str) -> AsyncIterator[Scratch]:
    """A :class:`Scratch` for the ``async with`` block; everything it made goes with it."""
    opened = await Scratch.open(server)
    try:
        yield opened
    finally:
        await opened.close()


@asynccontextmanager
async def scratch_database(server: str, kind: str = "scratch") -> AsyncIterator[str]:
    """One migrated database for the ``async with`` block: its URL; dropped afterwards."""
    async with scratch(server) as run:
        yield await run.migrated(kind)
