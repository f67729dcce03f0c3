"""``createBackup`` through the API, over real PostgreSQL and RabbitMQ: its body, its
refusals (which change nothing), its answers at each microversion, twice at once, and
the rotation its whole image makes (R kept, R=0, two rotations at once, a database call
failing once), with the Image API's property filters and sort Tempest lists them by."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest

from services.conductor import instance_events
from services.conductor.deadlines import TaskDeadline
from services.conductor.rpcapi import InstanceActionResult, PowerAction
from shared.config import Settings
from shared.db import backups
from tests.functional.faults import FailsOnce, every_call
from tests.functional.services.api.conftest import (
    MEMBER,
    OTHER_MEMBER,
    Faulty,
    at,
)
from tests.functional.services.api.test_snapshot_api import (
    SnapshotRecorder,
    agent,
    image_row,
    server_on,
    settings,
    state,
    upload_path,
)

pytestmark = [pytest.mark.functional, pytest.mark.usefixtures("conductor")]

# The snapshot tests' fixtures: a signing deployment with an image store, stand-in agents.
__all__ = ["agent", "settings"]


async def create_backup(
    client: httpx.AsyncClient, server_id: str, value: Any, headers: dict[str, str] = MEMBER
) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server_id}/action", headers=headers, json={"createBackup": value}
    )


def daily(name: str, rotation: Any = 2, **more: Any) -> dict[str, Any]:
    return {"name": name, "backup_type": "daily", "rotation": rotation, **more}


async def count_images(pool: asyncpg.Pool) -> int:
    async with pool.acquire() as conn:
        found: int = await conn.fetchval("SELECT count(*) FROM images")
    return found


async def end_snapshot(pool: asyncpg.Pool, server_id: str, *, success: bool = True) -> None:
    """The agent's result: the server's snapshot task ends."""
    result = InstanceActionResult(
        instance_uuid=UUID(server_id), action=PowerAction.SNAPSHOT, success=success
    )
    await instance_events.record_action_result(pool, result)


async def take_backup(
    client: httpx.AsyncClient,
    pool: asyncpg.Pool,
    agent: SnapshotRecorder,
    server_id: str,
    value: dict[str, Any],
) -> str:
    """A whole backup, as the agent writes it and reports it; its image id."""
    answer = await create_backup(client, server_id, value, at("2.45", MEMBER))
    assert answer.status_code == 202, answer.text
    _, req = await agent.next()
    put = await client.put(
        upload_path(req.upload_url), content=b"backup of " + value["name"].encode()
    )
    assert put.status_code == 204, put.text
    await end_snapshot(pool, server_id)
    image_id: str = answer.json()["image_id"]
    return image_id


async def live_backups(
    client: httpx.AsyncClient, server_id: str, backup_type: str = "daily"
) -> list[str]:
    """The server's active backups of ``backup_type``, oldest first, as Tempest asks."""
    listed = await client.get(
        "/image/v2/images",
        headers=MEMBER,
        params={
            "status": "active",
            "sort_key": "created_at",
            "sort_dir": "asc",
            "image_type": "backup",
            "backup_type": backup_type,
            "instance_uuid": server_id,
        },
    )
    assert listed.status_code == 200, listed.text
    return [image["name"] for image in listed.json()["images"]]


async def test_a_backup_is_a_snapshot_that_says_it_is_a_backup(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "backup-a")
    body = daily("b1", "3", metadata={"k": "v", "image_type": "mine", "backup_type": "x"})

    answer = await create_backup(client, server_id, body)

    assert answer.status_code == 202, answer.text
    location = answer.headers["location"]
    image_id = location.rsplit("/", 1)[-1]
    assert location == f"http://keel.test/image/v2/images/{image_id}"
    assert await state(db_pool, server_id) == ("active", "image_snapshot")
    row = await image_row(db_pool, image_id)
    assert (row["status"], row["visibility"], row["name"], row["backup_rotation"]) == (
        "queued",
        "private",
        "b1",
        3,
    )
    props = row["properties"]
    assert (props["image_type"], props["backup_type"], props["instance_uuid"]) == (
        "backup",
        "daily",
        server_id,
    )
    assert (props["k"], props["user_id"], props["os_distro"]) == ("v", "alice", "cirros")
    _, req = await agent.next()
    assert str(req.image_id) == image_id
    assert (await client.put(upload_path(req.upload_url), content=b"disk")).status_code == 204
    result = InstanceActionResult(
        instance_uuid=UUID(server_id), action=PowerAction.SNAPSHOT, success=True
    )
    await asyncio.gather(
        instance_events.record_action_result(db_pool, result),
        instance_events.record_action_result(db_pool, result),
    )
    assert await state(db_pool, server_id) == ("active", None)
    assert (await image_row(db_pool, image_id))["status"] == "active"
    actions = await client.get(f"/v2.1/servers/{server_id}/os-instance-actions", headers=MEMBER)
    recorded = [a for a in actions.json()["instanceActions"] if a["action"] == "createBackup"]
    assert len(recorded) == 1
    assert await live_backups(client, server_id) == ["b1"]


async def test_from_2_45_the_answer_is_the_image_id(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "backup-245")

    answer = await create_backup(client, server_id, daily("b", 0), at("2.45", MEMBER))

    assert answer.status_code == 202, answer.text
    assert "location" not in answer.headers
    row = await image_row(db_pool, answer.json()["image_id"])
    assert (row["status"], row["backup_rotation"]) == ("queued", 0)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({}, "name"),
        ({"backup_type": "daily", "rotation": 1}, "name"),
        ({"name": "b", "rotation": 1}, "backup_type"),
        ({"name": "b", "backup_type": "daily"}, "rotation"),
        (daily("", 1), "name"),
        (daily(" padded ", 1), "whitespace"),
        (daily("b", -1), "rotation"),
        (daily("b", "-1"), "rotation"),
        (daily("b", ""), "rotation"),
        (daily("b", "two"), "rotation"),
        (daily("b", 1.5), "rotation"),
        (daily("b", True), "rotation"),
        (daily("b", None), "rotation"),
        ({"name": "b", "backup_type": 1, "rotation": 1}, "backup_type"),
        (daily("b", 1, metadata={"k": 1}), "metadata"),
        (daily("b", 1, flavor="1"), "flavor"),
        ("backup", "object"),
    ],
)
async def test_a_bad_body_is_a_400_and_changes_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, value: Any, words: str
) -> None:
    server_id = await server_on(client, db_pool, None, f"backup-bad-{uuid4().hex[:8]}")

    answer = await create_backup(client, server_id, value)

    assert answer.status_code == 400, answer.text
    assert words in answer.text
    assert await state(db_pool, server_id) == ("active", None)
    assert await count_images(db_pool) == 1


async def test_refusals_change_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "backup-refused")

    other = await create_backup(client, server_id, daily("b"), OTHER_MEMBER)
    await client.post(f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={"lock": None})
    locked = await create_backup(client, server_id, daily("b"))
    await client.post(f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={"unlock": None})
    too_many = await create_backup(
        client, server_id, daily("b", metadata={f"k{n}": "v" for n in range(200)})
    )
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'error' WHERE uuid = $1", UUID(server_id)
        )
    errored = await create_backup(client, server_id, daily("b"))

    assert other.status_code == 404, other.text
    assert locked.status_code == 409, locked.text
    assert too_many.status_code == 403, too_many.text
    assert errored.status_code == 409, errored.text
    assert "Cannot 'createBackup'" in errored.text
    assert "vm_state error" in errored.text
    assert await state(db_pool, server_id) == ("error", None)
    assert await count_images(db_pool) == 1
    assert agent.requests.empty()


async def test_twice_at_once_is_one_backup_and_a_409(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "backup-twice")

    answers = await asyncio.gather(
        create_backup(client, server_id, daily("one"), at("2.45", MEMBER)),
        create_backup(client, server_id, daily("two"), at("2.45", MEMBER)),
    )

    assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
    assert await count_images(db_pool) == 2
    await agent.next()
    assert agent.requests.empty()


async def test_the_third_backup_of_a_rotation_of_two_deletes_the_oldest(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    agent: SnapshotRecorder,
    settings: Settings,
) -> None:
    server_id = await server_on(client, db_pool, agent, "backup-rotate")
    first = await take_backup(client, db_pool, agent, server_id, daily("b1"))
    second = await take_backup(client, db_pool, agent, server_id, daily("b2"))
    weekly = await take_backup(
        client, db_pool, agent, server_id, {"name": "w", "backup_type": "weekly", "rotation": 1}
    )
    snapshot = await client.post(
        f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={"createImage": {"name": "s"}}
    )
    assert snapshot.status_code == 202, snapshot.text
    _, req = await agent.next()
    assert (await client.put(upload_path(req.upload_url), content=b"s")).status_code == 204
    await end_snapshot(db_pool, server_id)
    assert await live_backups(client, server_id) == ["b1", "b2"]
    store: Path = settings.images.store_dir
    assert (store / first).exists()

    third = await take_backup(client, db_pool, agent, server_id, daily("b3"))

    assert await live_backups(client, server_id) == ["b2", "b3"]
    assert (await client.get(f"/image/v2/images/{first}", headers=MEMBER)).status_code == 404
    assert not (store / first).exists()
    for kept in (second, third, weekly):
        assert (await image_row(db_pool, kept))["deleted_at"] is None
        assert (store / kept).exists()
    assert await live_backups(client, server_id, "weekly") == ["w"]
    listed = await client.get("/image/v2/images", headers=MEMBER, params={"image_type": "snapshot"})
    assert [image["name"] for image in listed.json()["images"]] == ["s"]
    newest_first = await client.get(
        "/image/v2/images",
        headers=MEMBER,
        params={"sort_key": "created_at", "backup_type": "daily"},
    )
    assert [image["name"] for image in newest_first.json()["images"]] == ["b3", "b2"]


async def test_a_rotation_of_zero_deletes_every_backup_the_new_one_too(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "backup-zero")
    old = await take_backup(client, db_pool, agent, server_id, daily("b1", 5))

    new = await take_backup(client, db_pool, agent, server_id, daily("b2", 0))

    assert await live_backups(client, server_id) == []
    for gone in (old, new):
        assert (await image_row(db_pool, gone))["deleted_at"] is not None
    assert await state(db_pool, server_id) == ("active", None)


async def add_backup_row(
    pool: asyncpg.Pool,
    server_id: str,
    backup_type: str,
    age: int,
    *,
    rotation: int | None = None,
    owner: str = "team",
    protected: bool = False,
) -> UUID:
    """A whole backup image of the server, ``age`` minutes old, of ``owner``'s project."""
    image_id = uuid4()
    properties: dict[str, Any] = {
        "image_type": "backup",
        "backup_type": backup_type,
        "instance_uuid": server_id,
    }
    if protected:
        properties["protected"] = True
    async with pool.acquire() as conn:
        await conn.execute(
            """INSERT INTO images (id, name, status, visibility, owner, properties,
                                   backup_rotation, created_at)
               VALUES ($1, $2, 'active', 'private', $6, $3, $4,
                       now() - make_interval(mins => $5))""",
            image_id,
            f"{backup_type}-{age}",
            properties,
            rotation,
            age,
            owner,
        )
    return image_id


async def rotate(pool: asyncpg.Pool, image_id: UUID) -> list[UUID]:
    async with pool.acquire() as conn, conn.transaction():
        return await backups.rotate(conn, image_id)


async def test_two_rotations_at_once_delete_each_excess_backup_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    server_id = await server_on(client, db_pool, None, "backup-race")
    rows = [await add_backup_row(db_pool, server_id, "daily", age) for age in (50, 40, 30, 20)]
    newest = await add_backup_row(db_pool, server_id, "daily", 10, rotation=2)
    other_server = await add_backup_row(db_pool, str(uuid4()), "daily", 60)
    # Another project's image that says it is one of the server's backups.
    forged = await add_backup_row(db_pool, server_id, "daily", 70, owner="elsewhere")

    deleted = await asyncio.gather(*(rotate(db_pool, newest) for _ in range(3)))

    flat = [image for run in deleted for image in run]
    assert sorted(flat) == sorted(rows[:3])
    assert await rotate(db_pool, newest) == []
    async with db_pool.acquire() as conn:
        left = await conn.fetch(
            "SELECT id FROM images WHERE deleted_at IS NULL AND properties ? 'backup_type'"
        )
    assert {row["id"] for row in left} == {rows[3], newest, other_server, forged}


async def test_a_protected_backup_is_never_rotated_away_but_counts_among_the_backups(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    """As Nova's rotation, refused by the Image API for a protected backup: it stays, and
    the rotation deletes only the other excess ones (so fewer than R others are kept)."""
    server_id = await server_on(client, db_pool, None, "backup-protected")
    oldest = await add_backup_row(db_pool, server_id, "daily", 50, protected=True)
    older = await add_backup_row(db_pool, server_id, "daily", 40)
    kept = await add_backup_row(db_pool, server_id, "daily", 30)
    newest = await add_backup_row(db_pool, server_id, "daily", 10, rotation=2)

    assert await rotate(db_pool, newest) == [older]
    assert await rotate(db_pool, newest) == []
    assert (await image_row(db_pool, str(oldest)))["deleted_at"] is None
    assert (await image_row(db_pool, str(kept)))["deleted_at"] is None

    unprotect = [{"op": "replace", "path": "/protected", "value": False}]
    answer = await client.patch(
        f"/image/v2/images/{oldest}",
        headers={**MEMBER, "Content-Type": "application/openstack-images-v2.1-json-patch"},
        json=unprotect,
    )
    assert answer.status_code == 200, answer.text
    assert await rotate(db_pool, newest) == [oldest]


async def test_an_image_that_is_no_backup_rotates_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    server_id = await server_on(client, db_pool, None, "backup-none")
    old = await add_backup_row(db_pool, server_id, "daily", 30)
    unrotated = await add_backup_row(db_pool, server_id, "daily", 10)

    assert await rotate(db_pool, unrotated) == []
    assert await rotate(db_pool, uuid4()) == []
    assert (await image_row(db_pool, str(old)))["deleted_at"] is None


@pytest.mark.parametrize("answered", [False, True], ids=["failed", "answer-lost"])
async def test_a_database_call_failing_once_in_the_upload_rotates_whole_or_not_at_all(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    agent: SnapshotRecorder,
    faulty: Faulty,
    settings: Settings,
    *,
    answered: bool,
) -> None:
    """The agent's upload of a backup, each of its database calls failing in turn (or
    carried out with its answer lost): the image is active with its data and its rotation
    done, or queued with neither; the upload sent again makes it whole, and each excess
    backup is deleted once."""
    server_id = await server_on(client, db_pool, agent, "backup-faults")
    store: Path = settings.images.store_dir

    async def scenario(at_call: int) -> FailsOnce:
        kind = f"t{at_call}"
        old = [await add_backup_row(db_pool, server_id, kind, age) for age in (30, 20)]
        answer = await create_backup(
            client, server_id, {"name": kind, "backup_type": kind, "rotation": 2}, at("2.45")
        )
        assert answer.status_code == 202, answer.text
        new = answer.json()["image_id"]
        _, req = await agent.next()
        url = upload_path(req.upload_url)
        faulty.pool.arm(at_call, answered=answered)

        first = await faulty.client.put(url, content=b"data")

        row = await image_row(db_pool, new)
        oldest = await image_row(db_pool, str(old[0]))
        whole = row["status"] == "active"
        what = (faulty.pool.calls, row["status"], first.text)
        assert first.status_code == (503 if faulty.pool.failed else 204), what
        assert (oldest["deleted_at"] is not None) == whole, what
        assert (store / new).exists() == whole, what
        again = await client.put(url, content=b"data")
        if row["status"] == "saving":
            # The commit that began the upload took effect, its answer lost: the image
            # is held by that upload until it is stale, so the agent's retry is refused,
            # and it reports the snapshot failed: no backup, nothing rotated.
            assert answered, what
            assert again.status_code == 409, again.text
            await end_snapshot(db_pool, server_id, success=False)
            assert (await image_row(db_pool, new))["status"] == "killed"
            assert await live_backups(client, server_id, kind) == [f"{kind}-30", f"{kind}-20"]
            return faulty.pool
        assert again.status_code == (409 if whole else 204), again.text
        await end_snapshot(db_pool, server_id)
        assert await live_backups(client, server_id, kind) == [f"{kind}-20", kind]
        fetched = await client.get(f"/image/v2/images/{new}/file", headers=MEMBER)
        assert fetched.content == b"data"
        return faulty.pool

    assert await every_call(scenario) > 1


async def backup_record(pool: asyncpg.Pool, server_id: str) -> Any:
    async with pool.acquire() as conn:
        return await conn.fetchrow(
            """SELECT finish_time, result, message FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'createBackup'""",
            UUID(server_id),
        )


async def test_a_failed_or_overrun_backup_ends_its_action_and_kills_its_image(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "backup-failed")
    old = await add_backup_row(db_pool, server_id, "daily", 30)
    answer = await create_backup(client, server_id, daily("b", 0), at("2.45", MEMBER))
    image_id = answer.json()["image_id"]
    failed = InstanceActionResult(
        instance_uuid=UUID(server_id), action=PowerAction.SNAPSHOT, success=False, message="no"
    )

    await asyncio.gather(
        instance_events.record_action_result(db_pool, failed),
        instance_events.record_action_result(db_pool, failed),
    )

    assert await state(db_pool, server_id) == ("active", None)
    assert (await image_row(db_pool, image_id))["status"] == "killed"
    assert (await image_row(db_pool, str(old)))["deleted_at"] is None
    record = await backup_record(db_pool, server_id)
    assert (record["result"], record["message"]) == ("Error", "no")

    async with db_pool.acquire() as conn:
        await conn.execute("DELETE FROM instance_actions WHERE instance_uuid = $1", UUID(server_id))
    answer = await create_backup(client, server_id, daily("late", 0), at("2.45", MEMBER))
    late = answer.json()["image_id"]
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            UUID(server_id),
        )

    assert await TaskDeadline(db_pool, 60).sweep() == 1

    assert (await image_row(db_pool, late))["status"] == "killed"
    record = await backup_record(db_pool, server_id)
    assert record["finish_time"] is not None
    assert record["result"] == "Error"
    assert (await image_row(db_pool, str(old)))["deleted_at"] is None


async def test_the_agents_upload_sent_twice_at_once_rotates_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agent: SnapshotRecorder
) -> None:
    server_id = await server_on(client, db_pool, agent, "backup-put-twice")
    old = [await add_backup_row(db_pool, server_id, "daily", age) for age in (30, 20, 10)]
    answer = await create_backup(client, server_id, daily("b", 1), at("2.45", MEMBER))
    new = answer.json()["image_id"]
    _, req = await agent.next()
    url = upload_path(req.upload_url)

    puts = await asyncio.gather(
        client.put(url, content=b"one copy"), client.put(url, content=b"one copy")
    )

    assert sorted(p.status_code for p in puts) == [204, 409], [p.text for p in puts]
    await end_snapshot(db_pool, server_id)
    assert await live_backups(client, server_id) == ["b"]
    for gone in old:
        assert (await image_row(db_pool, str(gone)))["deleted_at"] is not None
    assert (await image_row(db_pool, new))["size"] == len(b"one copy")
