"""Backfill: online data migration rows/s over release-1 instance rows.

What is measured: a scratch database at the current schema with ``--hosts`` compute
hosts and ``--rows`` live instances written as release 1 wrote them (host and node
names, no ``compute_id``). Then ``instances.compute_id`` is backfilled exactly as
``keel-manage db online-data-migrations`` does it (:func:`shared.db.backfills.run`:
keyset batches of ``BATCH_SIZE`` rows, each in its own short transaction, locking only
that batch), and the rows linked per second are printed. Afterwards every row must be
linked to the node its names match.

Target: at least 100,000 rows/s. Run it with ``make bench`` or::

    .venv/bin/python bench/backfill.py --rows 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence

import asyncpg
from benchkit import report, target
from benchkit.db import DEFAULT_PG_SERVER, HostSize, add_hosts, scratch_database

from shared.db import backfills
from shared.db.backfills import BATCH_SIZE, INSTANCE_COMPUTE_ID

FLAVOR = '{"flavorid": "1", "name": "m1.tiny", "vcpus": 1, "memory_mb": 512, "root_gb": 1}'
#: Rows inserted per statement while preparing.
INSERT_CHUNK = 100_000


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="instance rows (1,000,000)")
    parser.add_argument("--hosts", type=int, default=1000, help="compute hosts (1,000)")
    parser.add_argument(
        "--batch-size", type=int, default=BATCH_SIZE, help=f"rows per batch ({BATCH_SIZE})"
    )
    args = parser.parse_args(argv)
    if min(args.rows, args.hosts) < 1:
        parser.error("counts must be at least 1")
    return args


async def prepare(conn: asyncpg.Connection, rows: int, hosts: int) -> float:
    """Hosts and release-1 instance rows; the seconds it took."""
    started = time.monotonic()
    await add_hosts(conn, 1, hosts, HostSize(vcpus=64, memory_mb=65536, local_gb=1000))
    for first in range(0, rows, INSERT_CHUNK):
        await conn.execute(
            """INSERT INTO instances (uuid, project_id, user_id, display_name, host, node,
                                      vm_state, flavor)
               SELECT gen_random_uuid(), 'p', 'u', 'legacy-' || g, h.host, h.host,
                      'active', $4::jsonb
                 FROM generate_series($1::int, $1::int + $2::int - 1) AS g
                 JOIN (SELECT host, row_number() OVER (ORDER BY host) - 1 AS k
                         FROM compute_nodes) h ON h.k = g % $3""",
            first,
            min(INSERT_CHUNK, rows - first),
            hosts,
            FLAVOR,
        )
    await conn.execute("ANALYZE instances")
    return time.monotonic() - started


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    async with scratch_database(DEFAULT_PG_SERVER) as url:
        conn = await asyncpg.connect(url)
        try:
            prepared = await prepare(conn, args.rows, args.hosts)
            started = time.monotonic()
            linked = await backfills.run(
                conn, INSTANCE_COMPUTE_ID, args.rows + 1, batch_size=args.batch_size
            )
            elapsed = time.monotonic() - started
            wrong = await conn.fetchval(
                """SELECT count(*) FROM instances i
                     LEFT JOIN compute_nodes n ON n.id = i.compute_id
                    WHERE n.id IS NULL OR n.host <> i.host"""
            )
        finally:
            await conn.close()
    rate = linked / elapsed if elapsed > 0 else float("nan")
    report(
        "backfill",
        {
            "rows": args.rows,
            "hosts": args.hosts,
            "batch_rows": args.batch_size,
            "prepare_s": prepared,
            "linked": linked,
            "elapsed_s": elapsed,
            "rows/s": rate,
            "wrongly_linked": wrong,
        },
    )
    if args.rows >= 1_000_000:
        target("backfill rows/s (1,000,000 rows)", rate, at_least=100_000, unit="/s")
    return 0 if linked == args.rows and wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
