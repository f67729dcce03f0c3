"""``/image/v2/schemas/image`` and ``/schemas/images``: the JSON schemas of image bodies.

glanceclient (and so Rally, and every tool built on it) reads them before it shows an
image: it builds its image objects from the schema and checks ``GET /v2/images/{id}``
against it. Each field keel shows is described with the types keel gives it (nullable
where keel may leave it unset); other properties are strings, as in Glance.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.auth import Context

router = APIRouter(prefix="/image/v2/schemas")

_STRING: dict[str, Any] = {"type": "string"}
_NULLABLE_STRING: dict[str, Any] = {"type": ["null", "string"], "maxLength": 255}
_NULLABLE_INT: dict[str, Any] = {"type": ["null", "integer"]}

IMAGE: dict[str, Any] = {
    "name": "image",
    "properties": {
        "id": {**_STRING, "description": "An identifier for the image", "readOnly": True},
        "name": _NULLABLE_STRING,
        "status": {
            **_STRING,
            "readOnly": True,
            "enum": [
                "queued",
                "saving",
                "active",
                "killed",
                "deleted",
                "uploading",
                "importing",
                "pending_delete",
                "deactivated",
            ],
        },
        "visibility": {**_STRING, "enum": ["community", "public", "private", "shared"]},
        "protected": {"type": "boolean"},
        "os_hidden": {"type": "boolean"},
        "tags": {"type": "array", "items": {**_STRING, "maxLength": 255}},
        "checksum": {**_NULLABLE_STRING, "readOnly": True},
        "os_hash_algo": {**_NULLABLE_STRING, "readOnly": True},
        "os_hash_value": {"type": ["null", "string"], "readOnly": True},
        "owner": _NULLABLE_STRING,
        "size": {**_NULLABLE_INT, "readOnly": True},
        "virtual_size": {**_NULLABLE_INT, "readOnly": True},
        "min_ram": {"type": "integer"},
        "min_disk": {"type": "integer"},
        "disk_format": _NULLABLE_STRING,
        "container_format": _NULLABLE_STRING,
        "created_at": {**_STRING, "readOnly": True},
        "updated_at": {**_STRING, "readOnly": True},
        "self": {**_STRING, "readOnly": True},
        "file": {**_STRING, "readOnly": True},
        "schema": {**_STRING, "readOnly": True},
        "kernel_id": {"type": ["null", "string"]},
        "ramdisk_id": {"type": ["null", "string"]},
    },
    "additionalProperties": _STRING,
    "links": [
        {"rel": "self", "href": "{self}"},
        {"rel": "enclosure", "href": "{file}"},
        {"rel": "describedby", "href": "{schema}"},
    ],
}

IMAGES: dict[str, Any] = {
    "name": "images",
    "properties": {
        "images": {"type": "array", "items": IMAGE},
        "schema": _STRING,
        "first": _STRING,
        "next": _STRING,
    },
    "links": [
        {"rel": "first", "href": "{first}"},
        {"rel": "next", "href": "{next}"},
        {"rel": "describedby", "href": "{schema}"},
    ],
}


@router.get("/image")
async def image_schema(ctx: Context) -> dict[str, Any]:
    return IMAGE


@router.get("/images")
async def images_schema(ctx: Context) -> dict[str, Any]:
    return IMAGES
