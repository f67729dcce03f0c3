"""The image schemas glanceclient reads: every image keel shows fits them.

glanceclient builds its image objects from ``/v2/schemas/image`` and rejects an image
whose fields do not match it; Rally finds its image through glanceclient.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import ADMIN, IMAGE_ID, MEMBER, add_image

pytestmark = pytest.mark.functional

JSON_TYPES: dict[type, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    list: "array",
    dict: "object",
    type(None): "null",
}


def misfits(image: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The fields of ``image`` whose value's JSON type the schema does not allow."""
    found = []
    for key, value in image.items():
        rule = schema["properties"].get(key, schema["additionalProperties"])
        allowed = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
        if JSON_TYPES[type(value)] not in allowed:
            found.append(f"{key}={value!r} is not {allowed}")
        if "enum" in rule and value not in rule["enum"]:
            found.append(f"{key}={value!r} is not one of {rule['enum']}")
    return found


async def test_every_image_shown_fits_the_image_schema(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_image(db_pool, "cirros")
    created = await client.post(
        "/image/v2/images",
        json={"name": "tagged", "tags": ["a"], "protected": True, "kernel_id": "k", "os_x": "y"},
        headers=ADMIN,
    )
    assert created.status_code == 201, created.text
    schema = (await client.get("/image/v2/schemas/image", headers=MEMBER)).json()
    assert schema["name"] == "image"
    for image_id in (str(IMAGE_ID), created.json()["id"]):
        image = (await client.get(f"/image/v2/images/{image_id}", headers=MEMBER)).json()
        assert misfits(image, schema) == []
    listing = (await client.get("/image/v2/schemas/images", headers=MEMBER)).json()
    assert listing["properties"]["images"]["items"] == schema
    assert (await client.get("/image/v2/schemas/image")).status_code == 401
