"""Image bodies in the Image API v2 shapes."""

from __future__ import annotations

from services.api.views.images import image_view, images_body
from tests.unit.services.api.factories import IMAGE_ID, image


def test_image_object() -> None:
    body = image_view(image())
    assert body["id"] == str(IMAGE_ID)
    assert body["name"] == "cirros"
    assert body["status"] == "active"
    assert body["self"] == f"/v2/images/{IMAGE_ID}"
    assert body["created_at"] == body["updated_at"] == "2024-05-01T12:00:00Z"
    assert body["tags"] == []


def test_properties_are_top_level_and_cannot_replace_core_fields() -> None:
    body = image_view(image(properties={"hw_arch": "x86_64", "id": "evil", "tags": ["a"]}))
    assert body["hw_arch"] == "x86_64"
    assert body["id"] == str(IMAGE_ID)
    assert body["tags"] == ["a"]


def test_list_with_and_without_next_page() -> None:
    full = images_body([image()], next_marker=str(IMAGE_ID), limit=1)
    assert full["next"] == f"/v2/images?marker={IMAGE_ID}&limit=1"
    last = images_body([image()], next_marker=None, limit=None)
    assert "next" not in last
    assert last["images"][0]["id"] == str(IMAGE_ID)
