"""Apply the numbered SQL files in ``migrations/`` once each, in order.

``keel-manage db sync`` calls :func:`sync`. It holds a PostgreSQL advisory lock for the
whole run, so two syncs started at once apply each file exactly once, and it records
every applied file in ``schema_migrations`` in the same transaction as the file itself.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

LOG = logging.getLogger(__name__)

#: Arbitrary, fixed: the advisory lock key that serialises schema changes.
_LOCK_KEY = 0x6B65656C  # "keel"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """Every migration shipped with this release, in order."""
    found = []
    for entry in resources.files("shared.db.schema_sql").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


async def applied(conn: asyncpg.Connection) -> set[int]:
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return set()
    return {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}


async def sync(conn: asyncpg.Connection, up_to: int | None = None) -> list[Migration]:
    """Apply what is missing (up to version ``up_to`` if given); return what was applied."""
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version    INTEGER PRIMARY KEY,
                   name       TEXT NOT NULL,
                   applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
        )
        done = await applied(conn)
        ran = []
        for migration in available():
            if migration.version in done or (up_to is not None and migration.version > up_to):
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            LOG.info("applied schema migration %04d_%s", migration.version, migration.name)
            ran.append(migration)
        return ran
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def pending(conn: asyncpg.Connection) -> list[Migration]:
    done = await applied(conn)
    return [m for m in available() if m.version not in done]
