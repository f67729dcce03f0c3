"""``PATCH /image/v2/images/{id}`` (a JSON patch, as ``openstack image set`` sends it) and
protected images, over real PostgreSQL: what a patch changes, what it refuses (each
refusal changes nothing), who may send it, concurrent patches losing nothing, and a
protected image that no one deletes until it is unprotected."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from shared.config import ImageSettings, Settings
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Faulty,
    Look,
    Send,
    add_image,
    at,
    every_fault,
)
from tests.functional.services.api.test_image_schemas import misfits

pytestmark = pytest.mark.functional

IMAGES = "/image/v2/images"
PATCH = "application/openstack-images-v2.1-json-patch"
PATCH_V20 = "application/openstack-images-v2.0-json-patch"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    images = ImageSettings(
        store_dir=tmp_path / "store", url_secret="x" * 32, max_size_bytes=1024 * 1024
    )
    return settings.model_copy(update={"images": images})


async def own_image(
    client: httpx.AsyncClient, headers: dict[str, str] = MEMBER, **fields: Any
) -> str:
    body = {"name": "mine", "disk_format": "raw", "container_format": "bare", **fields}
    created = await client.post(IMAGES, headers=headers, json=body)
    assert created.status_code == 201, created.text
    image_id: str = created.json()["id"]
    return image_id


async def patch(
    client: httpx.AsyncClient,
    image_id: str,
    ops: object,
    headers: dict[str, str] = MEMBER,
    media: str = PATCH,
) -> httpx.Response:
    return await client.patch(
        f"{IMAGES}/{image_id}",
        headers={**headers, "Content-Type": media},
        content=ops if isinstance(ops, bytes) else json.dumps(ops).encode(),
    )


async def shown(client: httpx.AsyncClient, image_id: str) -> dict[str, Any]:
    answer = await client.get(f"{IMAGES}/{image_id}", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def without_updated_at(image: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in image.items() if k != "updated_at"}


async def test_a_patch_as_the_cli_sends_it_changes_the_image_and_answers_it(
    client: httpx.AsyncClient,
) -> None:
    image_id = await own_image(client, visibility="private", hw_disk_bus="scsi", tags=["a"])
    before = await shown(client, image_id)

    answer = await patch(
        client,
        image_id,
        [
            {"op": "replace", "path": "/name", "value": "renamed"},
            {"op": "add", "path": "/os_distro", "value": "cirros"},
            {"op": "remove", "path": "/hw_disk_bus"},
            {"op": "replace", "path": "/visibility", "value": "community"},
            {"op": "replace", "path": "/protected", "value": True},
            {"op": "add", "path": "/os_hidden", "value": True},
            {"op": "replace", "path": "/min_ram", "value": 128},
            {"op": "add", "path": "/min_disk", "value": 2},
            {"op": "replace", "path": "/tags", "value": ["b", "c", "b"]},
            {"op": "replace", "path": "/disk_format", "value": "qcow2"},
            {"op": "replace", "path": "/container_format", "value": "ovf"},
            {"op": "add", "path": "/a~1b~0c", "value": "escaped"},
            {"op": "add", "path": "/os_distro", "value": "cirros-2"},
        ],
    )

    assert answer.status_code == 200, answer.text
    image = answer.json()
    assert image == await shown(client, image_id)
    assert (image["name"], image["visibility"], image["protected"], image["os_hidden"]) == (
        "renamed",
        "community",
        True,
        True,
    )
    assert (image["min_ram"], image["min_disk"], image["tags"]) == (128, 2, ["b", "c"])
    assert (image["disk_format"], image["container_format"]) == ("qcow2", "ovf")
    assert (image["os_distro"], image["a/b~c"]) == ("cirros-2", "escaped")
    assert "hw_disk_bus" not in image
    assert (image["id"], image["owner"], image["created_at"]) == (
        before["id"],
        before["owner"],
        before["created_at"],
    )
    schema = (await client.get("/image/v2/schemas/image", headers=MEMBER)).json()
    assert misfits(image, schema) == []


async def test_the_v2_0_patch_shape_and_an_empty_patch(client: httpx.AsyncClient) -> None:
    image_id = await own_image(client, visibility="private")
    old_shape = await patch(
        client,
        image_id,
        [{"replace": "/name", "value": "old-shape"}, {"add": "/k", "value": "v"}],
        media=PATCH_V20,
    )
    assert old_shape.status_code == 200, old_shape.text
    assert (old_shape.json()["name"], old_shape.json()["k"]) == ("old-shape", "v")
    # In v2.0 an ``add`` of an attribute the image already has is a conflict.
    again = await patch(client, image_id, [{"add": "/k", "value": "w"}], media=PATCH_V20)
    assert again.status_code == 409, again.text
    empty = await patch(client, image_id, [])
    assert empty.status_code == 200, empty.text
    assert empty.json()["k"] == "v"


@pytest.mark.parametrize(
    ("media", "ops", "status"),
    [
        ("application/json", [{"op": "replace", "path": "/name", "value": "x"}], 415),
        ("application/json-patch+json", [], 415),
        (PATCH, b"not json", 400),
        (PATCH, b"[" * 100_000, 400),
        (PATCH, b'[{"op": "add", "path": "/k", "value": "\\ud800"}]', 400),
        (PATCH, {"op": "replace", "path": "/name", "value": "x"}, 400),
        (PATCH, ["replace"], 400),
        (PATCH, [{"op": "move", "path": "/name", "value": "x"}], 400),
        (PATCH, [{"path": "/name", "value": "x"}], 400),
        (PATCH, [{"op": "replace", "value": "x"}], 400),
        (PATCH, [{"op": "replace", "path": "/name"}], 400),
        (PATCH, [{"op": "replace", "path": "name", "value": "x"}], 400),
        (PATCH, [{"op": "replace", "path": "/", "value": "x"}], 400),
        (PATCH, [{"op": "replace", "path": "/tags/0", "value": "x"}], 400),
        (PATCH, [{"op": "add", "path": "/a~2", "value": "x"}], 400),
        (PATCH, [{"op": "add", "path": 5, "value": "x"}], 400),
        (PATCH, [{"op": "add", "path": "/" + "k" * 256, "value": "x"}], 400),
        (PATCH, [{"op": "replace", "path": "/name", "value": 5}], 400),
        (PATCH, [{"op": "replace", "path": "/name", "value": "n" * 256}], 400),
        (PATCH, [{"op": "replace", "path": "/visibility", "value": "everyone"}], 400),
        (PATCH, [{"op": "replace", "path": "/protected", "value": "yes"}], 400),
        (PATCH, [{"op": "replace", "path": "/min_ram", "value": -1}], 400),
        (PATCH, [{"op": "replace", "path": "/min_disk", "value": 2**31}], 400),
        (PATCH, [{"op": "replace", "path": "/min_disk", "value": True}], 400),
        (PATCH, [{"op": "replace", "path": "/tags", "value": "a"}], 400),
        (PATCH, [{"op": "replace", "path": "/tags", "value": [1]}], 400),
        (PATCH, [{"op": "replace", "path": "/disk_format", "value": "floppy"}], 400),
        (PATCH, [{"op": "add", "path": "/k", "value": 1}], 400),
        (PATCH, [{"op": "add", "path": "/k", "value": "nul\u0000"}], 400),
        (PATCH, [{"op": "replace", "path": "/id", "value": "x"}], 403),
        (PATCH, [{"op": "replace", "path": "/status", "value": "active"}], 403),
        (PATCH, [{"op": "replace", "path": "/checksum", "value": "x"}], 403),
        (PATCH, [{"op": "replace", "path": "/size", "value": 1}], 403),
        (PATCH, [{"op": "replace", "path": "/created_at", "value": "x"}], 403),
        (PATCH, [{"op": "remove", "path": "/updated_at"}], 403),
        (PATCH, [{"op": "add", "path": "/os_glance_import_task", "value": "x"}], 403),
        (PATCH, [{"op": "add", "path": "/deleted", "value": "x"}], 403),
        (PATCH, [{"op": "add", "path": "/locations", "value": []}], 403),
        (PATCH, [{"op": "replace", "path": "/owner", "value": "elsewhere"}], 403),
        (PATCH, [{"op": "replace", "path": "/visibility", "value": "public"}], 403),
        (PATCH, [{"op": "remove", "path": "/name"}], 403),
        (PATCH, [{"op": "remove", "path": "/tags"}], 403),
        (PATCH, [{"op": "remove", "path": "/missing"}], 409),
        (PATCH, [{"op": "replace", "path": "/missing", "value": "x"}], 409),
        (PATCH, [{"op": "replace", "path": "/tags", "value": [f"t{n}" for n in range(129)]}], 413),
        (PATCH, [{"op": "add", "path": f"/k{n}", "value": "v"} for n in range(129)], 413),
    ],
)
async def test_a_refused_patch_changes_nothing(
    client: httpx.AsyncClient, media: str, ops: object, status: int
) -> None:
    image_id = await own_image(client, visibility="private", os_distro="d", tags=["t"])
    before = await shown(client, image_id)

    # A valid change first: a later refusal undoes it too.
    valid = [{"op": "replace", "path": "/name", "value": "changed"}]
    answer = await patch(
        client, image_id, valid + ops if isinstance(ops, list) else ops, media=media
    )

    assert answer.status_code == status, answer.text
    assert answer.json()  # a fault body
    assert await shown(client, image_id) == before
    if status == 415:
        assert PATCH in answer.headers["Accept-Patch"]


async def test_formats_change_only_while_the_image_is_queued(client: httpx.AsyncClient) -> None:
    image_id = await own_image(client, visibility="private")
    uploaded = await client.put(f"{IMAGES}/{image_id}/file", headers=MEMBER, content=b"*" * 8)
    assert uploaded.status_code == 204, uploaded.text

    for name in ("disk_format", "container_format"):
        refused = await patch(
            client, image_id, [{"op": "replace", "path": f"/{name}", "value": "ami"}]
        )
        assert refused.status_code == 403, refused.text
        assert "queued" in refused.text
    renamed = await patch(client, image_id, [{"op": "replace", "path": "/name", "value": "x"}])
    assert renamed.status_code == 200, renamed.text
    assert (renamed.json()["disk_format"], renamed.json()["status"]) == ("raw", "active")


async def test_who_may_patch_an_image(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    private = await own_image(client, visibility="private", k="secret-value")
    community = await own_image(client, visibility="community")
    public = str(await add_image(db_pool, "cirros", owner="ops"))
    rename = [{"op": "replace", "path": "/name", "value": "taken"}]

    unseen = await patch(client, private, rename, OTHER_MEMBER)
    assert unseen.status_code == 404, unseen.text
    assert "secret-value" not in unseen.text
    for seen in (community, public):
        refused = await patch(client, seen, rename, OTHER_MEMBER)
        assert refused.status_code == 403, refused.text
    missing = await patch(client, "00000000-0000-0000-0000-000000000000", rename)
    assert missing.status_code == 404
    assert (await patch(client, "not-a-uuid", rename)).status_code == 404
    assert (await shown(client, community))["name"] == "mine"

    # An admin changes any image, makes it public and gives it to another project.
    given = await patch(
        client,
        private,
        [
            {"op": "replace", "path": "/visibility", "value": "public"},
            {"op": "replace", "path": "/owner", "value": "elsewhere"},
        ],
        ADMIN,
    )
    assert given.status_code == 200, given.text
    assert (given.json()["visibility"], given.json()["owner"]) == ("public", "elsewhere")
    gone = await patch(client, private, rename)
    assert gone.status_code == 403, gone.text


async def test_concurrent_patches_lose_nothing(client: httpx.AsyncClient) -> None:
    image_id = await own_image(client, visibility="private")

    answers = await asyncio.gather(
        *(
            patch(client, image_id, [{"op": "add", "path": f"/k{n}", "value": str(n)}])
            for n in range(6)
        ),
        patch(client, image_id, [{"op": "replace", "path": "/tags", "value": ["x"]}]),
        patch(client, image_id, [{"op": "replace", "path": "/protected", "value": True}]),
        # The same patch twice at once: both succeed, with the same result.
        patch(client, image_id, [{"op": "add", "path": "/k0", "value": "0"}]),
    )

    assert [a.status_code for a in answers] == [200] * 9, [a.text for a in answers]
    image = await shown(client, image_id)
    assert {f"k{n}": image.get(f"k{n}") for n in range(6)} == {f"k{n}": str(n) for n in range(6)}
    assert (image["tags"], image["protected"]) == (["x"], True)


async def test_two_removes_of_one_property_at_once_are_one_200_and_one_409(
    client: httpx.AsyncClient,
) -> None:
    image_id = await own_image(client, visibility="private", k="v")

    answers = await asyncio.gather(
        *(patch(client, image_id, [{"op": "remove", "path": "/k"}]) for _ in range(2))
    )

    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    assert "k" not in await shown(client, image_id)


async def test_a_protected_image_is_deleted_by_no_one_until_unprotected(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    image_id = await own_image(client, visibility="private", protected=True)
    message = f"Image {image_id} is protected and cannot be deleted."

    for refused in (
        await client.delete(f"{IMAGES}/{image_id}", headers=MEMBER),
        await client.delete(f"{IMAGES}/{image_id}", headers=ADMIN),
        await client.delete(f"/v2.1/images/{image_id}", headers=at("2.35", MEMBER)),
        await client.delete(f"/v2.1/images/{image_id}", headers=at("2.35", ADMIN)),
    ):
        assert refused.status_code == 403, refused.text
        assert message in refused.text
    # Someone who only cannot see it still gets a 404.
    unseen = await client.delete(f"{IMAGES}/{image_id}", headers=OTHER_MEMBER)
    assert unseen.status_code == 404
    assert (await shown(client, image_id))["protected"] is True

    unprotected = await patch(
        client, image_id, [{"op": "replace", "path": "/protected", "value": False}]
    )
    assert unprotected.status_code == 200, unprotected.text
    assert unprotected.json()["protected"] is False
    deleted = await client.delete(f"/v2.1/images/{image_id}", headers=at("2.35", MEMBER))
    assert deleted.status_code == 204, deleted.text
    async with db_pool.acquire() as conn:
        assert await conn.fetchval(
            "SELECT deleted_at IS NOT NULL FROM images WHERE id = $1::uuid", image_id
        )


async def test_a_delete_racing_a_protecting_patch_either_deletes_or_refuses(
    client: httpx.AsyncClient,
) -> None:
    """A delete and a patch that protects the image, at once: the row lock orders them, so
    either the image is gone (and the patch a 404) or it is protected and kept (and the
    delete a 403); never a deleted image that says it is protected."""
    for _ in range(4):
        image_id = await own_image(client, visibility="private")
        protect = [{"op": "replace", "path": "/protected", "value": True}]
        deleted, patched = await asyncio.gather(
            client.delete(f"{IMAGES}/{image_id}", headers=MEMBER),
            patch(client, image_id, protect),
        )
        outcome = (deleted.status_code, patched.status_code)
        assert outcome in ((204, 404), (403, 200)), (deleted.text, patched.text)
        still = await client.get(f"{IMAGES}/{image_id}", headers=MEMBER)
        assert still.status_code == (200 if outcome == (403, 200) else 404)


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_patch_whose_database_call_fails_once_is_whole_or_absent_and_repeats(
    client: httpx.AsyncClient, faulty: Faulty, answered: bool
) -> None:
    """Each database call of a PATCH failing in turn: 503, then the image has every
    change of the patch or none of them, and the patch sent again makes them all."""

    async def write(name: str) -> tuple[Send, Look]:
        image_id = await own_image(client, name=name)
        ops = [
            {"op": "replace", "path": "/name", "value": f"{name}-renamed"},
            {"op": "add", "path": "/purpose", "value": "faults"},
            {"op": "replace", "path": "/tags", "value": ["faulted"]},
        ]

        async def send(c: httpx.AsyncClient) -> httpx.Response:
            return await patch(c, image_id, ops)

        async def look() -> tuple[str, str | None, list[str]]:
            image = await shown(client, image_id)
            return image["name"], image.get("purpose"), sorted(image["tags"])

        return send, look

    calls = await every_fault(faulty, client, answered, write, done=200)
    # The lock and read, the write, the commit; only the commit's answer matters.
    assert calls >= (1 if answered else 3)
