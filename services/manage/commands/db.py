"""``keel-manage db``: create and migrate the database, show its schema version, and run
the online data migrations (:mod:`services.manage.commands.backfills`)."""

from __future__ import annotations

import argparse

from services.manage.commands import backfills, set_handler
from services.manage.database import connect, database_name, ensure_database, server_of
from shared.config import Settings
from shared.db import schema


async def sync(args: argparse.Namespace, settings: Settings) -> int:
    """Create the database if needed, then apply every pending schema migration."""
    url = settings.database_url
    if await ensure_database(url):
        print(f"created database {database_name(url)} on {server_of(url)}")
    async with connect(url) as conn:
        ran = await schema.sync(conn)
    for migration in ran:
        print(f"applied {migration.version:04d}_{migration.name}")
    latest = max((m.version for m in schema.available()), default=0)
    if ran:
        print(f"database {database_name(url)} is at schema version {latest}")
    else:
        print(f"database {database_name(url)} is up to date (schema version {latest})")
    return 0


async def version(args: argparse.Namespace, settings: Settings) -> int:
    """List every migration of this release as applied or pending."""
    async with connect(settings.database_url) as conn:
        done = await schema.applied(conn)
    shipped = schema.available()
    for migration in shipped:
        state = "applied" if migration.version in done else "pending"
        print(f"{migration.version:04d}_{migration.name:<40} {state}")
    unknown = sorted(done - {m.version for m in shipped})
    for number in unknown:
        print(f"{number:04d}_{'?':<40} applied by a newer release")
    pending = sum(1 for m in shipped if m.version not in done)
    current = max(done, default=0)
    summary = f"schema version {current}, {pending} pending"
    if pending:
        summary += ": run 'keel-manage db sync'"
    print(summary)
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = commands.add_parser("db", help="database schema")
    actions = db.add_subparsers(dest="action", required=True, metavar="ACTION")
    set_handler(
        actions.add_parser(
            "sync",
            help="create the database if missing and apply pending migrations",
            description="Create the database named in KEEL_DATABASE_URL if it does not "
            "exist, then apply every pending schema migration. Safe to run again, and "
            "safe to run from several places at once.",
        ),
        sync,
    )
    set_handler(actions.add_parser("version", help="show applied and pending migrations"), version)
    backfills.register(actions)
