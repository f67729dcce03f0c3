"""Scratch databases: what a functional test pays for its own migrated database.

What is measured, ``--databases`` times each, on the test server: creating a database and
applying every schema migration to it (how each functional test got its database
before), then copying devkit's migrated template (``CREATE DATABASE ... TEMPLATE``, how
it gets one now), each followed by the drop a test's teardown does (in the background
now). Printed: seconds per database for each way and for the drop, and what the
difference comes to over ``--tests`` tests.

Target: a copy in well under a second (at most 0.3 s). Run it with
``make bench`` or::

    .venv/bin/python bench/scratch_db.py --databases 20
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

import asyncpg
from benchkit import report, target
from benchkit.db import DEFAULT_PG_SERVER

from devkit.database import Scratch, scratch
from shared.db import schema


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--databases", type=int, default=20, help="databases each way (20)")
    parser.add_argument(
        "--tests", type=int, default=440, help="tests to project the difference over (440)"
    )
    args = parser.parse_args(argv)
    if min(args.databases, args.tests) < 1:
        parser.error("counts must be at least 1")
    return args


async def migrated_from_scratch(run: Scratch) -> str:
    url = await run.empty("bench")
    conn = await asyncpg.connect(url)
    try:
        await schema.sync(conn)
    finally:
        await conn.close()
    return url


async def seconds_each(
    run: Scratch, make: Callable[[Scratch], Awaitable[str]], count: int
) -> tuple[float, float]:
    """Mean seconds to make a database ``make``'s way, and to drop it."""
    making = dropping = 0.0
    for _ in range(count):
        started = time.monotonic()
        url = await make(run)
        made = time.monotonic()
        await run.drop(url)
        making, dropping = making + made - started, dropping + time.monotonic() - made
    return making / count, dropping / count


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    async with scratch(DEFAULT_PG_SERVER) as run:
        await run.drop(await run.migrated("bench"))  # the template, migrated once
        migrated, _ = await seconds_each(run, migrated_from_scratch, args.databases)
        copied, dropped = await seconds_each(run, lambda r: r.migrated("bench"), args.databases)
    report(
        "scratch database",
        {
            "databases": args.databases,
            "create_and_migrate_s": migrated,
            "template_copy_s": copied,
            "drop_s": dropped,
            "speed-up": migrated / copied,
            f"saved_over_{args.tests}_tests_s": (migrated - copied) * args.tests,
        },
    )
    target("template copy", copied, at_most=0.3, unit="s")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
