"""Images registered by members, as Glance's default policies allow, and their metadata
through the compute API below 2.39: a project changes its own images only, and never
changes or sees another project's private ones."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from shared.config import ImageSettings, Settings
from tests.functional.services.api.conftest import ADMIN, MEMBER, OTHER_MEMBER, add_image, at

pytestmark = pytest.mark.functional

IMAGES = "/image/v2/images"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    images = ImageSettings(
        store_dir=tmp_path / "store", url_secret="x" * 32, max_size_bytes=1024 * 1024
    )
    return settings.model_copy(update={"images": images})


async def register(
    client: httpx.AsyncClient, headers: dict[str, str] = MEMBER, **fields: Any
) -> httpx.Response:
    body = {"name": "mine", "disk_format": "raw", "container_format": "bare", **fields}
    return await client.post(IMAGES, headers=headers, json=body)


async def own_image(client: httpx.AsyncClient, **fields: Any) -> str:
    created = await register(client, **fields)
    assert created.status_code == 201, created.text
    image_id: str = created.json()["id"]
    return image_id


def old(headers: dict[str, str]) -> dict[str, str]:
    return at("2.38", headers)


async def test_a_member_registers_uploads_and_deletes_its_own_image(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    created = await register(client, visibility="private", min_ram=64)
    assert created.status_code == 201, created.text
    image = created.json()
    assert (image["owner"], image["visibility"], image["status"]) == ("team", "private", "queued")
    uploaded = await client.put(f"{IMAGES}/{image['id']}/file", headers=MEMBER, content=b"*" * 64)
    assert uploaded.status_code == 204, uploaded.text
    shown = await client.get(f"/v2.1/images/{image['id']}", headers=at("2.35", MEMBER))
    assert shown.json()["image"]["status"] == "ACTIVE"
    deleted = await client.delete(f"{IMAGES}/{image['id']}", headers=MEMBER)
    assert deleted.status_code == 204
    async with db_pool.acquire() as conn:
        gone = await conn.fetchval(
            "SELECT deleted_at IS NOT NULL FROM images WHERE id = $1::uuid", image["id"]
        )
    assert gone


async def test_a_members_image_is_shared_by_default_and_community_is_allowed(
    client: httpx.AsyncClient,
) -> None:
    assert (await register(client)).json()["visibility"] == "shared"
    assert (await register(client, visibility="community")).json()["visibility"] == "community"
    assert (await register(client, headers=ADMIN)).json()["visibility"] == "public"


@pytest.mark.parametrize(
    ("fields", "status"),
    [({"visibility": "public"}, 403), ({"owner": "elsewhere"}, 403), ({"name": ""}, 400)],
)
async def test_what_only_admins_may_register(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, fields: dict[str, Any], status: int
) -> None:
    refused = await register(client, **fields)
    assert refused.status_code == status, refused.text
    async with db_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM images") == 0


async def test_another_project_neither_sees_nor_changes_a_private_image(
    client: httpx.AsyncClient,
) -> None:
    image_id = await own_image(client, visibility="private")
    await client.put(
        f"/v2.1/images/{image_id}/metadata",
        headers=old(MEMBER),
        json={"metadata": {"a": "secret-value"}},
    )
    attempts = [
        client.get(f"{IMAGES}/{image_id}", headers=OTHER_MEMBER),
        client.put(f"{IMAGES}/{image_id}/file", headers=OTHER_MEMBER, content=b"x"),
        client.delete(f"{IMAGES}/{image_id}", headers=OTHER_MEMBER),
        client.delete(f"/v2.1/images/{image_id}", headers=at("2.35", OTHER_MEMBER)),
        client.get(f"/v2.1/images/{image_id}/metadata", headers=old(OTHER_MEMBER)),
        client.get(f"/v2.1/images/{image_id}/metadata/a", headers=old(OTHER_MEMBER)),
        client.post(
            f"/v2.1/images/{image_id}/metadata",
            headers=old(OTHER_MEMBER),
            json={"metadata": {"b": "2"}},
        ),
        client.put(
            f"/v2.1/images/{image_id}/metadata/a",
            headers=old(OTHER_MEMBER),
            json={"meta": {"a": "9"}},
        ),
        client.delete(f"/v2.1/images/{image_id}/metadata/a", headers=old(OTHER_MEMBER)),
    ]
    for answer in await asyncio.gather(*attempts):
        assert answer.status_code == 404, answer.text
        assert "secret-value" not in answer.text
        assert "private" not in answer.text
    listed = await client.get(IMAGES, headers=OTHER_MEMBER)
    assert image_id not in {i["id"] for i in listed.json()["images"]}
    mine = await client.get(f"/v2.1/images/{image_id}/metadata", headers=old(MEMBER))
    assert mine.json() == {"metadata": {"a": "secret-value"}}
    assert (await client.get(f"{IMAGES}/{image_id}", headers=MEMBER)).status_code == 200


async def test_an_image_seen_but_not_owned_is_403_to_change(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    image_id = await own_image(client, visibility="community")
    for refused in (
        await client.delete(f"{IMAGES}/{image_id}", headers=OTHER_MEMBER),
        await client.delete(f"/v2.1/images/{image_id}", headers=at("2.35", OTHER_MEMBER)),
        await client.post(
            f"/v2.1/images/{image_id}/metadata",
            headers=old(OTHER_MEMBER),
            json={"metadata": {"b": "2"}},
        ),
    ):
        assert refused.status_code == 403, refused.text
    public = await add_image(db_pool, "cirros", owner="ops")
    changed = await client.put(
        f"/v2.1/images/{public}/metadata", headers=old(MEMBER), json={"metadata": {}}
    )
    assert changed.status_code == 403
    assert (await client.get(f"{IMAGES}/{image_id}", headers=MEMBER)).status_code == 200


async def test_image_metadata_routes_as_nova_served_them_below_2_39(
    client: httpx.AsyncClient,
) -> None:
    image_id = await own_image(client, visibility="private", tags=["t"], protected=True)
    base = f"/v2.1/images/{image_id}/metadata"
    replaced = await client.put(
        base, headers=old(MEMBER), json={"metadata": {"os_version": "1", "os_distro": "d"}}
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json() == {"metadata": {"os_version": "1", "os_distro": "d"}}
    merged = await client.post(
        base, headers=old(MEMBER), json={"metadata": {"os_version": "2", "arch": "x"}}
    )
    assert merged.json() == {"metadata": {"os_version": "2", "os_distro": "d", "arch": "x"}}
    item = await client.put(f"{base}/arch", headers=old(MEMBER), json={"meta": {"arch": "y"}})
    assert item.json() == {"meta": {"arch": "y"}}
    shown = await client.get(f"{base}/arch", headers=old(MEMBER))
    assert shown.json() == {"meta": {"arch": "y"}}
    assert (await client.delete(f"{base}/arch", headers=old(MEMBER))).status_code == 204
    assert (await client.get(f"{base}/arch", headers=old(MEMBER))).status_code == 404
    assert (await client.delete(f"{base}/arch", headers=old(MEMBER))).status_code == 404
    listed = await client.get(base, headers=old(MEMBER))
    assert listed.json() == {"metadata": {"os_version": "2", "os_distro": "d"}}
    image = (await client.get(f"{IMAGES}/{image_id}", headers=MEMBER)).json()
    assert (image["tags"], image["protected"], image["os_distro"]) == (["t"], True, "d")
    assert (await client.get(base, headers=at("2.39", MEMBER))).status_code == 404


async def test_concurrent_metadata_changes_lose_none(client: httpx.AsyncClient) -> None:
    image_id = await own_image(client, visibility="private")
    base = f"/v2.1/images/{image_id}/metadata"
    answers = await asyncio.gather(
        *(
            client.post(base, headers=old(MEMBER), json={"metadata": {f"k{i}": str(i)}})
            for i in range(6)
        ),
        client.post(base, headers=old(MEMBER), json={"metadata": {"k0": "0"}}),
    )
    assert [a.status_code for a in answers] == [200] * 7
    listed = await client.get(base, headers=old(MEMBER))
    assert listed.json()["metadata"] == {f"k{i}": str(i) for i in range(6)}


@pytest.mark.parametrize(
    ("path", "method", "body", "status"),
    [
        ("", "post", {"metadata": {"bad/key": "v"}}, 400),
        ("", "post", {"metadata": {"k": 5}}, 400),
        ("", "post", {"metadata": {"k": "v" * 256}}, 400),
        ("", "put", {"meta": {"k": "v"}}, 400),
        ("", "put", {"metadata": {"name": "renamed"}}, 403),
        ("", "post", {"metadata": {f"k{i}": "v" for i in range(129)}}, 403),
        ("/k", "put", {"meta": {"other": "v"}}, 400),
        ("/k", "put", {"meta": {"k": "v", "j": "w"}}, 400),
        ("/k", "put", {"meta": {}}, 400),
    ],
)
async def test_bad_metadata_is_refused_and_changes_nothing(
    client: httpx.AsyncClient, path: str, method: str, body: object, status: int
) -> None:
    image_id = await own_image(client, visibility="private", os_distro="d")
    url = f"/v2.1/images/{image_id}/metadata{path}"
    refused = await client.request(method.upper(), url, headers=old(MEMBER), json=body)
    assert refused.status_code == status, refused.text
    listed = await client.get(f"/v2.1/images/{image_id}/metadata", headers=old(MEMBER))
    assert listed.json() == {"metadata": {"os_distro": "d"}}
    missing = await client.get(
        "/v2.1/images/00000000-0000-0000-0000-000000000000/metadata", headers=old(MEMBER)
    )
    assert missing.status_code == 404
