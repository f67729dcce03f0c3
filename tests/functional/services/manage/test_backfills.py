"""``keel-manage db online-data-migrations`` on a database upgraded from release 1.

The database is built at the schema release 1 had (the migrations before the one adding
``instances.compute_id``) with rows as release 1 wrote them, then upgraded with ``db
sync``; the backfill then links the rows, batch by batch, while leaving alone the one
it cannot resolve.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from devkit.database import Scratch
from services.manage.commands.backfills import run_all
from services.manage.main import build_parser, execute
from shared.config import Settings
from shared.db import backfills, schema
from shared.versions import SERVICE_VERSION
from tests.functional.services.manage.test_manage import manage

pytestmark = pytest.mark.functional

#: The last schema migration before instances were linked to their node by id.
RELEASE_1_SCHEMA = max(
    m.version
    for m in schema.available()
    if m.version < next(n.version for n in schema.available() if n.name == "instances_compute_id")
)

FLAVOR = '{"flavorid": "1", "name": "m1.tiny", "vcpus": 1, "memory_mb": 512, "root_gb": 1}'


@pytest.fixture
async def release_1_url(databases: Scratch) -> AsyncIterator[str]:
    """A database at release 1's schema, holding nothing yet."""
    url = await databases.empty("upgrade")
    conn = await asyncpg.connect(url)
    try:
        await schema.sync(conn, up_to=RELEASE_1_SCHEMA)
    finally:
        await conn.close()
    yield url
    databases.drop_soon(url)


async def _compute(conn: asyncpg.Connection, host: str, hypervisor: str) -> tuple[int, int]:
    service_id = await conn.fetchval(
        """INSERT INTO services (uuid, host, "binary", topic, version)
           VALUES ($1, $2, 'keel-compute', 'compute', 1) RETURNING id""",
        uuid.uuid4(),
        host,
    )
    node_id = await conn.fetchval(
        """INSERT INTO compute_nodes (uuid, service_id, host, hypervisor_hostname,
                                      vcpus, memory_mb, local_gb)
           VALUES ($1, $2, $3, $4, 8, 8192, 100) RETURNING id""",
        uuid.uuid4(),
        service_id,
        host,
        hypervisor,
    )
    return service_id, node_id


async def _instance(
    conn: asyncpg.Connection, host: str | None, node: str | None, *, deleted: bool = False
) -> uuid.UUID:
    instance_uuid = uuid.uuid4()
    await conn.execute(
        """INSERT INTO instances (uuid, project_id, user_id, display_name, host, node,
                                  vm_state, flavor, deleted_at)
           VALUES ($1, 'p', 'u', 'vm', $2, $3, 'active', $4::jsonb,
                   CASE WHEN $5 THEN now() END)""",
        instance_uuid,
        host,
        node,
        FLAVOR,
        deleted,
    )
    return instance_uuid


async def release_1_rows(url: str) -> dict[str, Any]:
    """What release 1 left: nodes linked to services by id, instances by names only."""
    conn = await asyncpg.connect(url)
    try:
        _, node1 = await _compute(conn, "compute1", "compute1")
        _, node2 = await _compute(conn, "compute2", "compute2.example.org")
        _, node3 = await _compute(conn, "compute3", "compute3")
        await conn.execute("UPDATE compute_nodes SET service_id = NULL WHERE id = $1", node3)
        rows = {
            "node2": node2,
            "node3": node3,
            "expected": {
                await _instance(conn, "compute1", "compute1"): node1,
                await _instance(conn, "compute1", "compute1"): node1,
                await _instance(conn, "compute3", "compute3"): node3,
            },
            # The host's only node has another name: linking it would be a guess.
            "renamed": await _instance(conn, "compute2", "compute2"),
            "ghost": await _instance(conn, "ghost", "ghost"),
            "unplaced": await _instance(conn, None, None),
            "deleted": await _instance(conn, "compute1", "compute1", deleted=True),
        }
    finally:
        await conn.close()
    return rows


async def links(url: str) -> dict[uuid.UUID, int | None]:
    conn = await asyncpg.connect(url)
    try:
        return {
            row["uuid"]: row["compute_id"]
            for row in await conn.fetch("SELECT uuid, compute_id FROM instances")
        }
    finally:
        await conn.close()


async def test_upgrade_from_release_1_then_backfill_in_steps_of_one(release_1_url: str) -> None:
    rows = await release_1_rows(release_1_url)
    synced = manage(release_1_url, "db", "sync")
    assert synced.returncode == 0, synced.stderr
    assert "_instances_compute_id" in synced.stdout

    codes, outputs = [], []
    for _ in range(10):
        step = manage(release_1_url, "db", "online-data-migrations", "--max-count", "1")
        codes.append(step.returncode)
        assert step.stdout.startswith("Migration"), step.stdout + step.stderr
        outputs.append(step.stdout)
        assert f"instance {rows['ghost']} (host ghost, node ghost)" in step.stdout
        assert (
            f"instance {rows['renamed']} (host compute2, node compute2): no live compute node "
            "of that host has that name (its nodes: compute2.example.org)"
        ) in step.stdout
        assert "2 row(s) cannot be resolved and stay unlinked" in step.stdout
        if step.returncode == 0:
            assert "nothing remains to migrate" in step.stdout
            break
    # One node without its service link, three instances: four steps, the last one 0.
    assert codes == [1, 1, 1, 0], "\n".join(outputs)

    linked = await links(release_1_url)
    assert {k: linked[k] for k in rows["expected"]} == rows["expected"]
    assert linked[rows["renamed"]] is None
    assert linked[rows["ghost"]] is None
    assert linked[rows["unplaced"]] is None
    assert linked[rows["deleted"]] is None
    conn = await asyncpg.connect(release_1_url)
    try:
        assert await conn.fetchval(
            "SELECT service_id FROM compute_nodes WHERE id = $1", rows["node3"]
        )
        assert await backfills.unlinked_rows(conn) == {
            "compute_nodes.service_id": 0,
            "instances.compute_id": 2,
        }
    finally:
        await conn.close()

    again = manage(release_1_url, "db", "online-data-migrations")
    assert again.returncode == 0, again.stderr
    table = again.stdout.splitlines()
    assert table[1].split() == ["compute_nodes.service_id", "0", "0"]
    assert table[2].split() == ["instances.compute_id", "2", "0"]
    assert await links(release_1_url) == linked


async def test_running_before_db_sync_is_an_error_that_says_so(release_1_url: str) -> None:
    result = manage(release_1_url, "db", "online-data-migrations")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "migration instances.compute_id failed" in result.stderr
    assert "run `keel-manage db sync` first" in result.stderr


@pytest.mark.parametrize("bad", ["0", "-3", "many", "1.5", ""])
def test_max_count_must_be_a_positive_integer(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["db", "online-data-migrations", "--max-count", bad])
    # Refused before any database is reached.
    assert execute(args, Settings(database_url="postgresql://postgres@127.0.0.1:1/x")) == 127
    out, err = capsys.readouterr()
    assert "--max-count must be a positive integer" in err
    assert out == ""


async def test_unreachable_database_is_an_error(database_url: str) -> None:
    result = manage(
        "postgresql://postgres@127.0.0.1:1/keel", "db", "online-data-migrations", "--max-count", "5"
    )
    assert result.returncode == 2
    assert "cannot reach PostgreSQL" in result.stderr


async def test_concurrent_runs_link_every_row_once(release_1_url: str) -> None:
    conn = await asyncpg.connect(release_1_url)
    try:
        await schema.sync(conn)
        _, node = await _compute(conn, "compute1", "compute1")
        await conn.executemany(
            """INSERT INTO instances (uuid, project_id, user_id, display_name, host, node,
                                      vm_state, flavor)
               VALUES ($1, 'p', 'u', 'vm', 'compute1', 'compute1', 'active', $2::jsonb)""",
            [(uuid.uuid4(), FLAVOR) for _ in range(240)],
        )
    finally:
        await conn.close()
    conns = [await asyncpg.connect(release_1_url) for _ in range(3)]
    try:
        outcomes = await asyncio.gather(*(run_all(c, None) for c in conns))
    finally:
        for c in conns:
            await c.close()

    done = sum(o.done for run in outcomes for o in run if o.name == "instances.compute_id")
    assert done == 240
    assert all(o.error is None for run in outcomes for o in run)
    assert set((await links(release_1_url)).values()) == {node}


async def test_upgrade_check_warns_while_rows_lack_their_links(release_1_url: str) -> None:
    rows = await release_1_rows(release_1_url)
    unsynced = manage(release_1_url, "status", "upgrade-check")
    assert unsynced.returncode == 1, unsynced.stdout + unsynced.stderr
    assert "the database schema is older than this release: run `keel-manage db sync`" in (
        unsynced.stdout
    )
    assert manage(release_1_url, "db", "sync").returncode == 0
    conn = await asyncpg.connect(release_1_url)
    try:
        # Every service on this release: only the links are left to warn about.
        await conn.execute("UPDATE services SET version = $1", SERVICE_VERSION)
    finally:
        await conn.close()

    before = manage(release_1_url, "status", "upgrade-check")
    assert before.returncode == 1, before.stdout + before.stderr
    assert (
        "WARNING: 3 row(s) written by an older release lack their link instances.compute_id: "
        "run `keel-manage db online-data-migrations` (migration instances.compute_id) to link "
        "them."
    ) in before.stdout
    assert "WARNING: 1 row(s) written by an older release lack their link " in before.stdout
    assert "(migration compute_nodes.service_id)" in before.stdout
    stuck = (
        "WARNING: 2 row(s) lack their link instances.compute_id and the online migration "
        "instances.compute_id cannot link them"
    )
    assert stuck in before.stdout
    assert f"  instance {rows['renamed']} (host compute2, node compute2)" in before.stdout
    assert f"  instance {rows['ghost']} (host ghost, node ghost)" in before.stdout
    assert "SUCCESS" not in before.stdout

    assert manage(release_1_url, "db", "online-data-migrations").returncode == 0
    after = manage(release_1_url, "status", "upgrade-check")
    assert after.returncode == 1, after.stdout
    assert "written by an older release" not in after.stdout
    assert stuck in after.stdout

    # As docs/upgrades.md says: the hypervisor gets its old name back for the migration (its
    # agent started with it would record it), and the server of the gone host is deleted.
    conn = await asyncpg.connect(release_1_url)
    try:
        await conn.execute(
            "UPDATE compute_nodes SET hypervisor_hostname = 'compute2' WHERE id = $1",
            rows["node2"],
        )
        await conn.execute("UPDATE instances SET deleted_at = now() WHERE uuid = $1", rows["ghost"])
    finally:
        await conn.close()
    assert manage(release_1_url, "db", "online-data-migrations").returncode == 0
    assert (await links(release_1_url))[rows["renamed"]] == rows["node2"]
    done = manage(release_1_url, "status", "upgrade-check")
    assert done.returncode == 0, done.stdout
    assert "WARNING" not in done.stdout
    assert done.stdout.splitlines()[-1].startswith("SUCCESS")
