"""The image JSON patch and the image schema agree: every attribute the schema calls
read-only is refused by a patch, and every base attribute is one a patch knows."""

from __future__ import annotations

import json

import pytest

from services.api.http.faults import Fault
from services.api.resources.image_patch import BASE, PATCH_V21, READ_ONLY, RESERVED, parse_patch
from services.api.resources.image_schemas import image_properties

#: Schema properties that are extra (string) properties a patch sets like any other.
EXTRA_IN_SCHEMA = {
    "kernel_id",
    "ramdisk_id",
    "instance_uuid",
    "architecture",
    "os_distro",
    "os_version",
}


def code_of(name: str, op: str = "replace") -> int | None:
    body = json.dumps([{"op": op, "path": f"/{name}", "value": "x"}]).encode()
    try:
        parse_patch(body, PATCH_V21)
    except Fault as refused:
        return refused.code
    return None


@pytest.mark.parametrize(
    "name", sorted(k for k, v in image_properties().items() if v.get("readOnly"))
)
def test_what_the_schema_calls_read_only_a_patch_refuses(name: str) -> None:
    assert name in READ_ONLY
    assert code_of(name) == code_of(name, "add") == code_of(name, "remove") == 403


def test_every_schema_property_is_known_to_the_patch() -> None:
    known = BASE | READ_ONLY | RESERVED | EXTRA_IN_SCHEMA
    assert set(image_properties()) - known == set()
    assert set(image_properties()) >= BASE
