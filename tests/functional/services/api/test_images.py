"""The image registry: the Image API (/image/v2) and the compute API's proxy below 2.36."""

from __future__ import annotations

from uuid import UUID

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import ADMIN, IMAGE_ID, MEMBER, add_image

pytestmark = pytest.mark.functional

OTHER_ID = UUID("22222222-2222-3333-4444-555555555555")
PRIVATE_ID = UUID("33333333-2222-3333-4444-555555555555")


async def test_list_show_and_filters(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    prefix = "/image/v2"
    await add_image(db_pool, "cirros")
    await add_image(db_pool, "ubuntu", OTHER_ID)
    listed = await client.get(f"{prefix}/images", headers=MEMBER)
    assert [i["name"] for i in listed.json()["images"]] == ["cirros", "ubuntu"]
    named = await client.get(f"{prefix}/images", headers=MEMBER, params={"name": "ubuntu"})
    assert [i["id"] for i in named.json()["images"]] == [str(OTHER_ID)]
    by_ids = await client.get(
        f"{prefix}/images", headers=MEMBER, params={"id": f"in:{IMAGE_ID},{OTHER_ID}"}
    )
    assert len(by_ids.json()["images"]) == 2
    shown = await client.get(f"{prefix}/images/{IMAGE_ID}", headers=MEMBER)
    assert shown.json()["name"] == "cirros"
    assert shown.json()["status"] == "active"
    by_name = await client.get(f"{prefix}/images/cirros", headers=MEMBER)
    assert by_name.status_code == 404


async def test_paging_follows_next(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    await add_image(db_pool, "cirros")
    await add_image(db_pool, "ubuntu", OTHER_ID)
    first = await client.get("/image/v2/images", headers=MEMBER, params={"limit": 1})
    assert len(first.json()["images"]) == 1
    next_page = first.json()["next"].removeprefix("/v2")
    second = await client.get(f"/image/v2{next_page}", headers=MEMBER)
    assert [i["name"] for i in second.json()["images"]] == ["ubuntu"]


async def test_private_images_are_seen_by_their_project_only(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_image(db_pool, "secret", PRIVATE_ID, visibility="private", owner="elsewhere")
    for prefix in ("/v2.1", "/image/v2"):
        assert (await client.get(f"{prefix}/images", headers=MEMBER)).json()["images"] == []
        hidden = await client.get(f"{prefix}/images/{PRIVATE_ID}", headers=MEMBER)
        assert hidden.status_code == 404
        assert len((await client.get(f"{prefix}/images", headers=ADMIN)).json()["images"]) == 1


async def test_admin_registers_and_deletes_an_image(client: httpx.AsyncClient) -> None:
    body = {
        "name": "fedora",
        "disk_format": "qcow2",
        "container_format": "bare",
        "os_distro": "fedora",
    }
    created = await client.post("/image/v2/images", headers=ADMIN, json=body)
    assert created.status_code == 201, created.text
    image = created.json()
    assert image["status"] == "queued"
    assert image["os_distro"] == "fedora"
    assert image["owner"] == "ops"
    listed = await client.get("/image/v2/images", headers=MEMBER, params={"name": "fedora"})
    assert [i["id"] for i in listed.json()["images"]] == [image["id"]]

    refused = await client.delete(f"/image/v2/images/{image['id']}", headers=MEMBER)
    assert refused.status_code == 403
    deleted = await client.delete(f"/image/v2/images/{image['id']}", headers=ADMIN)
    assert deleted.status_code == 204
    assert (await client.get(f"/image/v2/images/{image['id']}", headers=ADMIN)).status_code == 404


async def test_bad_image_requests_are_400(client: httpx.AsyncClient) -> None:
    bad_filter = await client.get("/image/v2/images", headers=MEMBER, params={"id": "in:nope"})
    assert bad_filter.status_code == 400
    for body in ({"name": "x", "min_ram": -1}, {"name": "x", "os_distro": 7}, {}):
        response = await client.post("/image/v2/images", headers=ADMIN, json=body)
        assert response.status_code == 400, body


async def test_the_compute_proxy_shows_images_as_nova_did_below_2_36(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_image(db_pool, "cirros", min_ram=64)
    await add_image(db_pool, "ubuntu", OTHER_ID)
    old = {**MEMBER, "OpenStack-API-Version": "compute 2.35"}
    listed = await client.get("/v2.1/images", headers=old)
    assert listed.status_code == 200, listed.text
    first = listed.json()["images"][0]
    assert set(first) == {"id", "name", "links"}
    assert [link["rel"] for link in first["links"]] == ["self", "bookmark", "alternate"]
    assert first["links"][0]["href"] == f"http://keel.test/v2.1/images/{IMAGE_ID}"
    assert first["links"][2]["href"] == f"http://keel.test/image/images/{IMAGE_ID}"

    detail = await client.get("/v2.1/images/detail", headers=old)
    assert detail.status_code == 200, detail.text
    [cirros, ubuntu] = detail.json()["images"]
    assert (cirros["minRam"], cirros["minDisk"], cirros["status"], cirros["progress"]) == (
        64,
        0,
        "ACTIVE",
        100,
    )
    assert cirros["metadata"] == {}
    assert "OS-EXT-IMG-SIZE:size" in cirros
    shown = await client.get(f"/v2.1/images/{OTHER_ID}", headers=old)
    assert shown.json()["image"] == ubuntu

    filtered = await client.get("/v2.1/images/detail", headers=old, params={"minRam": 32})
    assert [i["name"] for i in filtered.json()["images"]] == ["cirros"]
    by_name = await client.get("/v2.1/images", headers=old, params={"name": "ubuntu"})
    assert [i["id"] for i in by_name.json()["images"]] == [str(OTHER_ID)]
    page = await client.get("/v2.1/images", headers=old, params={"limit": 1})
    assert len(page.json()["images"]) == 1
    assert "marker=" in page.json()["images_links"][0]["href"]
    missing = await client.get("/v2.1/images/cirros", headers=old)
    assert missing.status_code == 404
    refused = await client.delete(f"/v2.1/images/{OTHER_ID}", headers=old)
    assert refused.status_code == 403
    deleted = await client.delete(
        f"/v2.1/images/{OTHER_ID}", headers={**ADMIN, "OpenStack-API-Version": "compute 2.35"}
    )
    assert deleted.status_code == 204
    for path in ("/v2.1/images", "/v2.1/images/detail", f"/v2.1/images/{IMAGE_ID}"):
        gone = await client.get(path, headers={**MEMBER, "OpenStack-API-Version": "compute 2.36"})
        assert gone.status_code == 404, path


async def test_any_other_parameter_filters_on_an_image_property_and_lists_sort(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    """As Glance v2: ``?image_type=backup`` filters on that property; ``sort_key`` and
    ``sort_dir`` order the list (newest first unless asked), and ``next`` keeps both."""
    await add_image(db_pool, "cirros")
    await add_image(db_pool, "ubuntu", OTHER_ID)
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE images SET properties = '{"image_type": "backup", "os_hidden": false}',
                      created_at = now() - interval '1 hour' WHERE id = $1""",
            OTHER_ID,
        )

    typed = await client.get("/image/v2/images", headers=MEMBER, params={"image_type": "backup"})
    none = await client.get("/image/v2/images", headers=MEMBER, params={"image_type": "other"})
    unset = await client.get("/image/v2/images", headers=MEMBER, params={"backup_type": "daily"})
    newest = await client.get("/image/v2/images", headers=MEMBER, params={"sort_key": "created_at"})
    oldest = await client.get(
        "/image/v2/images", headers=MEMBER, params={"sort_key": "created_at", "sort_dir": "asc"}
    )
    paged = await client.get(
        "/image/v2/images", headers=MEMBER, params={"sort_dir": "asc", "limit": 1}
    )
    bad_key = await client.get("/image/v2/images", headers=MEMBER, params={"sort_key": "owner"})
    bad_dir = await client.get("/image/v2/images", headers=MEMBER, params={"sort_dir": "up"})

    assert [i["name"] for i in typed.json()["images"]] == ["ubuntu"]
    assert none.json()["images"] == unset.json()["images"] == []
    assert [i["name"] for i in newest.json()["images"]] == ["cirros", "ubuntu"]
    assert [i["name"] for i in oldest.json()["images"]] == ["ubuntu", "cirros"]
    assert [i["name"] for i in paged.json()["images"]] == ["ubuntu"]
    following = await client.get(
        "/image/v2" + paged.json()["next"].removeprefix("/v2"), headers=MEMBER
    )
    assert [i["name"] for i in following.json()["images"]] == ["cirros"]
    assert (bad_key.status_code, bad_dir.status_code) == (400, 400), (bad_key.text, bad_dir.text)
    assert "sort key" in bad_key.text
