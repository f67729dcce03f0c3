"""``keel-manage db online-data-migrations``: run the registered backfills.

Prints one table row per backfill — the rows that needed it when it started (found) and
the rows it linked (done) — then the rows that cannot be resolved (left NULL), and what
remains. Exit codes, for scripts that repeat it with ``--max-count``: 0 when nothing
remains to be done, 1 when more remains, 2 when a backfill failed (or the database could
not be reached), 127 for a ``--max-count`` that is not a positive integer.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import asyncpg

from services.manage.commands import set_handler
from services.manage.commands.service import table
from services.manage.database import connect
from shared.config import Settings
from shared.db import backfills
from shared.db.backfills import Backfill
from shared.db.errors import describe
from shared.db.pool import Connection
from shared.exceptions import KeelError

EXIT_DONE = 0
EXIT_MORE = 1
EXIT_ERROR = 2
EXIT_BAD_ARGUMENT = 127

#: Without ``--max-count``, each backfill runs until nothing it can resolve is left.
UNLIMITED = 2**62

COLUMNS = ("Migration", "Found", "Done")


@dataclass
class Outcome:
    name: str
    found: int = 0
    done: int = 0
    remaining: int = 0
    unresolved: int = 0
    examples: list[str] = field(default_factory=list)
    error: str | None = None


def parse_max_count(value: str | None) -> int | None:
    """``None`` (no limit), or the positive integer ``value`` says; ValueError otherwise."""
    if value is None:
        return None
    count = int(value.strip(), 10)
    if count < 1:
        raise ValueError(value)
    return count


async def _run_one(conn: Connection, backfill: Backfill, budget: int) -> Outcome:
    outcome = Outcome(backfill.name)
    try:
        outcome.found = await backfills.pending(conn, backfill)
        if budget > 0:
            outcome.done = await backfills.run(conn, backfill, budget)
        outcome.remaining = await backfills.remaining(conn, backfill)
        outcome.unresolved, outcome.examples = await backfills.unresolved(conn, backfill)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        outcome.error = describe(exc)
    return outcome


async def run_all(conn: Connection, max_count: int | None) -> list[Outcome]:
    """Run every backfill in order, sharing ``max_count`` rows among them."""
    budget = UNLIMITED if max_count is None else max_count
    outcomes = []
    for backfill in backfills.MIGRATIONS:
        outcome = await _run_one(conn, backfill, budget)
        budget -= outcome.done
        outcomes.append(outcome)
    return outcomes


def report(outcomes: list[Outcome]) -> int:
    """Print the table and what is left; return the exit code."""
    print(table(COLUMNS, [(o.name, str(o.found), str(o.done)) for o in outcomes]))
    for o in outcomes:
        if o.unresolved:
            print(
                f"{o.name}: {o.unresolved} row(s) cannot be resolved and stay unlinked: "
                "nothing matches their names, and keel never links by guess (keel finds no "
                'node for them; see docs/upgrades.md, "Upgrading: online data migrations"):'
            )
            for example in o.examples:
                print(f"  {example}")
            if o.unresolved > len(o.examples):
                print(f"  ... and {o.unresolved - len(o.examples)} more")
    for o in outcomes:
        if o.error is not None:
            print(
                f"keel-manage: migration {o.name} failed: {o.error}; if the schema is older "
                "than this release, run `keel-manage db sync` first",
                file=sys.stderr,
            )
    if any(o.error is not None for o in outcomes):
        return EXIT_ERROR
    left = sum(o.remaining for o in outcomes)
    if left:
        print(f"{left} row(s) remain: run the command again")
        return EXIT_MORE
    print("nothing remains to migrate")
    return EXIT_DONE


async def online_data_migrations(args: argparse.Namespace, settings: Settings) -> int:
    try:
        max_count = parse_max_count(args.max_count)
    except ValueError:
        print(
            f"keel-manage: --max-count must be a positive integer, not {args.max_count!r}",
            file=sys.stderr,
        )
        return EXIT_BAD_ARGUMENT
    try:
        async with connect(settings.database_url) as conn:
            outcomes = await run_all(conn, max_count)
    except KeelError as exc:
        print(f"keel-manage: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    return report(outcomes)


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = actions.add_parser(
        "online-data-migrations",
        help="fill in links that rows written by older releases lack",
        description="Run the registered data migrations in small batches, safely while "
        "every service runs. Exit 0 when nothing remains, 1 when more remains (run it "
        "again), 2 on errors, 127 for a bad --max-count. Rows that cannot be resolved are "
        "reported and left as they are.",
    )
    parser.add_argument(
        "--max-count",
        metavar="N",
        help="link at most N rows in this run (a positive integer); default: all",
    )
    set_handler(parser, online_data_migrations)
