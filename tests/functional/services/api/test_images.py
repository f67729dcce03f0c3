"""The image registry through both of its paths."""

from __future__ import annotations

from uuid import UUID

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import ADMIN, IMAGE_ID, MEMBER, add_image

pytestmark = pytest.mark.functional

OTHER_ID = UUID("22222222-2222-3333-4444-555555555555")
PRIVATE_ID = UUID("33333333-2222-3333-4444-555555555555")


@pytest.mark.parametrize("prefix", ["/v2.1", "/image/v2"])
async def test_list_show_and_filters(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, prefix: str
) -> None:
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
    assert (await client.get("/v2.1/images", headers=MEMBER)).json()["images"] == []
    hidden = await client.get(f"/v2.1/images/{PRIVATE_ID}", headers=MEMBER)
    assert hidden.status_code == 404
    assert len((await client.get("/v2.1/images", headers=ADMIN)).json()["images"]) == 1


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
    assert image["status"] == "active"
    assert image["os_distro"] == "fedora"
    assert image["owner"] == "ops"
    listed = await client.get("/v2.1/images", headers=MEMBER, params={"name": "fedora"})
    assert [i["id"] for i in listed.json()["images"]] == [image["id"]]

    refused = await client.delete(f"/image/v2/images/{image['id']}", headers=MEMBER)
    assert refused.status_code == 403
    deleted = await client.delete(f"/image/v2/images/{image['id']}", headers=ADMIN)
    assert deleted.status_code == 204
    assert (await client.get(f"/v2.1/images/{image['id']}", headers=ADMIN)).status_code == 404


async def test_bad_image_requests_are_400(client: httpx.AsyncClient) -> None:
    bad_filter = await client.get("/v2.1/images", headers=MEMBER, params={"id": "in:nope"})
    assert bad_filter.status_code == 400
    for body in ({"name": "x", "min_ram": -1}, {"name": "x", "os_distro": 7}, {}):
        response = await client.post("/image/v2/images", headers=ADMIN, json=body)
        assert response.status_code == 400, body
