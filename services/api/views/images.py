"""Image bodies in the Image API v2 shapes: bare objects, and ``{"images": [...]}`` lists.

An image's extra properties appear as top-level fields, as the Image API shows them;
``tags`` and ``protected`` may be set through them too.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from services.api.views.timestamps import isotime
from shared.objects.image import Image

IMAGES_PATH = "/v2/images"


def image_view(image: Image) -> dict[str, Any]:
    image_id = str(image.id)
    body: dict[str, Any] = {
        "id": image_id,
        "name": image.name,
        "status": image.status,
        "visibility": image.visibility,
        "protected": False,
        "os_hidden": False,
        "tags": [],
        "checksum": image.checksum,
        "os_hash_algo": image.os_hash_algo,
        "os_hash_value": image.os_hash_value,
        "owner": image.owner,
        "size": image.size,
        "virtual_size": None,
        "min_ram": image.min_ram,
        "min_disk": image.min_disk,
        "disk_format": image.disk_format,
        "container_format": image.container_format,
        "created_at": isotime(image.created_at),
        "updated_at": isotime(image.updated_at or image.created_at),
        "self": f"{IMAGES_PATH}/{image_id}",
        "file": f"{IMAGES_PATH}/{image_id}/file",
        "schema": "/v2/schemas/image",
    }
    overridable = {"protected", "os_hidden", "tags"}
    for key, value in image.properties.items():
        if key not in body or key in overridable:
            body[key] = value
    return body


def images_body(
    images: list[Image],
    *,
    next_marker: str | None,
    limit: int | None,
    carried: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A list page; ``next`` points at the following page when this one was full, with
    the list's other query parameters (``carried``: its filters and sort) kept."""
    body: dict[str, Any] = {
        "images": [image_view(image) for image in images],
        "first": IMAGES_PATH,
        "schema": "/v2/schemas/images",
    }
    if next_marker is not None:
        query = {"marker": next_marker, **({"limit": str(limit)} if limit else {})}
        query.update({k: v for k, v in (carried or {}).items() if k not in query})
        body["next"] = f"{IMAGES_PATH}?{urlencode(query)}"
    return body
