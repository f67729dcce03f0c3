"""Version discovery: what the client reads before anything else, without a token.

``GET /`` lists the API versions as Nova does: ``v2.0`` (DEPRECATED) first, then
``v2.1``; ``GET /v2.1/`` describes the compute API, with the microversion range the
client negotiates within. ``GET /v2/`` describes ``v2.0`` so that its link can be
followed, but keel serves no v2.0 API under it: clients speak v2.1. ``GET /image/`` is
the image API's discovery document, for clients configured with a separate image endpoint.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.deps import RequestLinks
from services.api.http.links import Links
from services.api.http.microversion import MAX_VERSION, MIN_VERSION

router = APIRouter()

UPDATED = "2013-07-23T11:33:21Z"
LEGACY_UPDATED = "2025-07-04T12:00:00Z"
IMAGE_API_VERSIONS = ("2.16", "2.0")


def compute_version(links: Links) -> dict[str, Any]:
    return {
        "id": "v2.1",
        "status": "CURRENT",
        "version": str(MAX_VERSION),
        "min_version": str(MIN_VERSION),
        "updated": UPDATED,
        "links": [{"rel": "self", "href": links.compute() + "/"}],
        "media-types": [
            {
                "base": "application/json",
                "type": "application/vnd.openstack.compute+json;version=2.1",
            }
        ],
    }


def legacy_version(links: Links) -> dict[str, Any]:
    """The v2.0 entry: no microversions (``version`` and ``min_version`` empty)."""
    return {
        "id": "v2.0",
        "status": "DEPRECATED",
        "version": "",
        "min_version": "",
        "updated": LEGACY_UPDATED,
        "links": [{"rel": "self", "href": links.bookmark("v2") + "/"}],
        "media-types": [
            {
                "base": "application/json",
                "type": "application/vnd.openstack.compute+json;version=2",
            }
        ],
    }


@router.get("/")
async def list_versions(links: RequestLinks) -> dict[str, Any]:
    return {"versions": [legacy_version(links), compute_version(links)]}


@router.get("/v2")
@router.get("/v2/")
async def show_legacy_version(links: RequestLinks) -> dict[str, Any]:
    return {"version": legacy_version(links)}


@router.get("/v2.1")
@router.get("/v2.1/")
async def show_compute_version(links: RequestLinks) -> dict[str, Any]:
    return {"version": compute_version(links)}


@router.get("/image")
@router.get("/image/")
async def list_image_versions(links: RequestLinks) -> dict[str, Any]:
    href = links.bookmark("image", "v2") + "/"
    versions = [
        {
            "id": f"v{version}",
            "status": "CURRENT" if index == 0 else "SUPPORTED",
            "links": [{"rel": "self", "href": href}],
        }
        for index, version in enumerate(IMAGE_API_VERSIONS)
    ]
    return {"versions": versions}
