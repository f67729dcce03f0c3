"""Images as the compute API showed them below microversion 2.36 (Nova's image proxy).

Not the Image API's shape: ``minRam``/``minDisk``, ``metadata`` (the image's
properties), ``status`` in capitals, ``progress``, ``OS-EXT-IMG-SIZE:size``, and
``self``/``bookmark``/``alternate`` links; lists of ``{"id", "name", "links"}`` or of
the whole image (``/detail``), with an ``images_links`` next link when a page is full.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from services.api.http.links import Links
from services.api.views.timestamps import isotime
from shared.objects.image import Image

_STATUS = {
    "active": "ACTIVE",
    "queued": "SAVING",
    "saving": "SAVING",
    "importing": "SAVING",
    "uploading": "SAVING",
    "deleted": "DELETED",
    "pending_delete": "DELETED",
    "killed": "ERROR",
}
_PROGRESS = {"queued": 25, "saving": 50, "active": 100}


def image_links(image: Image, links: Links) -> list[dict[str, str]]:
    image_id = str(image.id)
    return [
        *links.resource("images", image_id),
        {
            "rel": "alternate",
            "type": "application/vnd.openstack.image",
            "href": links.bookmark("image", "images", image_id),
        },
    ]


def image_summary(image: Image, links: Links) -> dict[str, Any]:
    return {"id": str(image.id), "name": image.name, "links": image_links(image, links)}


def image_detail(image: Image, links: Links) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(image.id),
        "name": image.name,
        "minRam": image.min_ram,
        "minDisk": image.min_disk,
        "metadata": {k: v for k, v in image.properties.items() if isinstance(v, str)},
        "created": isotime(image.created_at),
        "updated": isotime(image.updated_at or image.created_at),
        "status": _STATUS.get(image.status, "UNKNOWN"),
        "progress": _PROGRESS.get(image.status, 0),
        "OS-EXT-IMG-SIZE:size": image.size,
        "links": image_links(image, links),
    }
    server = image.properties.get("instance_uuid")
    if isinstance(server, str):
        body["server"] = {"id": server, "links": links.resource("servers", server)}
    return body


def images_page(
    shown: list[dict[str, Any]], links: Links, path: str, *, next_marker: str | None, limit: int
) -> dict[str, Any]:
    body: dict[str, Any] = {"images": shown}
    if next_marker is not None:
        query = urlencode({"limit": limit, "marker": next_marker})
        body["images_links"] = [{"rel": "next", "href": f"{links.compute(path)}?{query}"}]
    return body
