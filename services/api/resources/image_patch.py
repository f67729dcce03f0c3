"""An Image API v2 image update: a JSON-patch document checked and applied to an image.

``PATCH /image/v2/images/{id}`` (served by :mod:`.images`) takes a list of operations in
the media type ``application/openstack-images-v2.1-json-patch``: ``{"op": "add" |
"replace" | "remove", "path": "/NAME", "value": ...}`` (or the older
``application/openstack-images-v2.0-json-patch``: ``{"replace": "/NAME", "value": ...}``,
where ``add`` of an attribute the image already has is a 409). Any other media type is a
415 that lists these two in ``Accept-Patch``.

:func:`parse_patch` checks the document on its own: a malformed one, a path that is no
JSON pointer to a top-level attribute, or a missing ``value`` is a 400; a read-only or
reserved attribute a 403. :func:`apply_patch` then applies the operations in order to an
:class:`ImageChanges` copy of the image: a value of the wrong type is a 400, what the
caller may not do (``public`` for a member, ``owner`` for a member, a format of an image
that is no longer ``queued``, removing a base attribute) a 403, replacing or removing an
extra property the image does not have a 409, and more tags or extra properties than
:data:`MAX_TAGS` or :data:`MAX_PROPERTIES` a 413. Nothing is written unless every
operation succeeds (the caller writes the result in the transaction that locked the row).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.exceptions import HTTPException

from services.api.http.bounds import INT4_MAX
from services.api.http.faults import BadRequest, ConflictingRequest, Fault, Forbidden, short
from services.api.resources.image_schemas import CONTAINER_FORMATS, DISK_FORMATS, VISIBILITIES
from shared.context import RequestContext
from shared.objects.image import Image, stored_properties

PATCH_V21 = "application/openstack-images-v2.1-json-patch"
PATCH_V20 = "application/openstack-images-v2.0-json-patch"
PATCH_TYPES = (PATCH_V21, PATCH_V20)

Op = Literal["add", "replace", "remove"]
OPS: tuple[Op, ...] = ("add", "replace", "remove")

#: Attributes keel computes: a patch naming one is a 403.
READ_ONLY = frozenset(
    {
        "id",
        "status",
        "checksum",
        "os_hash_algo",
        "os_hash_value",
        "size",
        "virtual_size",
        "created_at",
        "updated_at",
        "direct_url",
        "self",
        "file",
        "schema",
    }
)
#: Names no image property may take (Glance reserves them, and the ``os_glance`` prefix);
#: keel keeps no image locations, so ``locations`` is refused as well.
RESERVED = frozenset({"location", "locations", "deleted", "deleted_at"})
RESERVED_PREFIX = "os_glance"
#: The base attributes a patch may set (never remove); every other name is an extra
#: (string) property.
BASE = frozenset(
    {
        "name",
        "visibility",
        "protected",
        "os_hidden",
        "min_ram",
        "min_disk",
        "tags",
        "container_format",
        "disk_format",
        "owner",
    }
)
#: Base attributes a patch sets only while the image has no data (``queued``).
QUEUED_ONLY = frozenset({"container_format", "disk_format"})
#: Glance's default ``image_tag_quota`` and ``image_property_quota``.
MAX_TAGS = 128
MAX_PROPERTIES = 128
MAX_TEXT = 255

_ESCAPE = re.compile(r"~[^01]|~$")


class OverLimit(Fault):
    def __init__(self, message: str) -> None:
        super().__init__(413, message)


@dataclass(frozen=True)
class Change:
    op: Op
    name: str
    value: Any = None
    #: ``add`` of an existing attribute is a conflict (the v2.0 media type).
    add_must_be_new: bool = False


_OPERATION = {
    "type": "object",
    "properties": {
        "op": {"type": "string", "enum": list(OPS)},
        "path": {"type": "string", "pattern": "^/"},
        "value": {},
    },
    "required": ["op", "path"],
}
#: The request body in the OpenAPI document, under both media types.
OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            kind: {"schema": {"type": "array", "items": _OPERATION}} for kind in PATCH_TYPES
        },
    }
}


def media_type(content_type: str | None) -> str:
    """The request's patch media type; a 415 naming the accepted ones otherwise."""
    given = (content_type or "").split(";", 1)[0].strip().lower()
    if given not in PATCH_TYPES:
        raise HTTPException(
            415,
            f"Unsupported Content-Type {given or '(none)'!r}: an image update is a JSON "
            f"patch sent as {PATCH_V21} (or {PATCH_V20}).",
            headers={"Accept-Patch": ", ".join(PATCH_TYPES)},
        )
    return given


def _pointer(path: object) -> str:
    """The one attribute name a JSON pointer (``/name``, ``~1`` and ``~0`` escapes) names."""
    if not isinstance(path, str):
        raise BadRequest('Invalid JSON pointer: a path must be a string such as "/name".')
    if not path.startswith("/"):
        raise BadRequest(f'Pointer `{short(path)}` does not start with "/".')
    if _ESCAPE.search(path):
        raise BadRequest(f'Pointer `{short(path)}` has a "~" that is no escape.')
    parts = path[1:].split("/")
    if len(parts) != 1 or not parts[0].strip():
        raise BadRequest(f"Invalid JSON pointer for this resource: '{short(path)}'")
    name = parts[0].replace("~1", "/").replace("~0", "~").strip()
    if len(name) > MAX_TEXT or not _storable(name):
        raise BadRequest(
            f"Invalid JSON pointer for this resource: an attribute name is at most "
            f"{MAX_TEXT} characters of UTF-8 text without NUL."
        )
    return name


def _refuse_read_only(name: str) -> None:
    if name in READ_ONLY:
        raise Forbidden(f"Attribute '{name}' is read-only.")
    if name in RESERVED or name.startswith(RESERVED_PREFIX):
        raise Forbidden(f"Attribute '{name}' is reserved.")


def _operation(raw: dict[str, Any], kind: str) -> tuple[Op, object]:
    """The operation and its path, in the media type's shape."""
    if kind == PATCH_V21:
        op = raw.get("op")
        if op not in OPS:
            raise BadRequest(
                f"Invalid operation: {short(op)}. It must be one of the following: "
                f"{', '.join(OPS)}."
            )
        if "path" not in raw:
            raise BadRequest("Unable to find 'path' in JSON Schema change")
        return op, raw["path"]
    named = [op for op in OPS if op in raw]
    if len(named) != 1:
        raise BadRequest(
            'Operation objects must contain exactly one member named "add", "remove", or "replace".'
        )
    return named[0], raw[named[0]]


def parse_patch(body: bytes, kind: str) -> list[Change]:
    """The document's changes, each checked on its own (no image needed yet)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest("Malformed request body: it must be a JSON array.") from None
    if not isinstance(document, list):
        raise BadRequest("Request body must be a JSON array of operation objects.")
    changes = []
    for raw in document:
        if not isinstance(raw, dict):
            raise BadRequest("Operations must be JSON objects.")
        op, path = _operation(raw, kind)
        name = _pointer(path)
        _refuse_read_only(name)
        if op != "remove" and "value" not in raw:
            raise BadRequest(f'Operation "{op}" requires a member named "value".')
        changes.append(Change(op, name, raw.get("value"), add_must_be_new=kind == PATCH_V20))
    return changes


@dataclass
class ImageChanges:
    """What a patch may change of an image; the image's other properties in ``extra``."""

    status: str
    name: str | None
    visibility: str
    owner: str | None
    min_ram: int
    min_disk: int
    disk_format: str | None
    container_format: str | None
    protected: bool
    os_hidden: bool
    tags: list[str]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, image: Image) -> ImageChanges:
        props = dict(image.properties)
        tags = props.pop("tags", [])
        return cls(
            status=image.status,
            name=image.name,
            visibility=image.visibility,
            owner=image.owner,
            min_ram=image.min_ram,
            min_disk=image.min_disk,
            disk_format=image.disk_format,
            container_format=image.container_format,
            protected=bool(props.pop("protected", False)),
            os_hidden=bool(props.pop("os_hidden", False)),
            tags=list(tags) if isinstance(tags, list) else [],
            extra=props,
        )

    def properties(self) -> dict[str, Any]:
        """The ``properties`` column: extras, and the flags and tags where set (as
        registration stores them)."""
        return stored_properties(
            self.extra, tags=self.tags, protected=self.protected, os_hidden=self.os_hidden
        )


def _text(name: str, value: object, *, nullable: bool) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT or not _storable(value):
        kind = "null or a string" if nullable else "a string"
        raise BadRequest(f"Invalid value for '{name}': {kind} of at most {MAX_TEXT} characters.")
    return value


def _storable(value: str) -> bool:
    """Whether PostgreSQL stores the text: UTF-8 encodable, and without NUL."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT4_MAX:
        raise BadRequest(f"Invalid value for '{name}': an integer from 0 to {INT4_MAX}.")
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"Invalid value for '{name}': true or false.")
    return value


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str | None:
    if value is not None and value not in allowed:
        raise BadRequest(f"Invalid value for '{name}': one of {', '.join(allowed)}, or null.")
    return value if isinstance(value, str) else None


def _tags(value: object) -> list[str]:
    if not isinstance(value, list):
        raise BadRequest("Invalid value for 'tags': a list of strings.")
    tags: list[str] = []
    for tag in value:
        text = _text("tags", tag, nullable=False)
        if text is not None and text not in tags:
            tags.append(text)
    if len(tags) > MAX_TAGS:
        raise OverLimit(f"Maximum number of tags exceeded: {len(tags)}, at most {MAX_TAGS}.")
    return tags


def _set_base(ctx: RequestContext, image: ImageChanges, name: str, value: object) -> None:
    if name in QUEUED_ONLY and image.status != "queued":
        raise Forbidden(f"Attribute {name} can be only replaced for a queued image.")
    if name == "name":
        image.name = _text(name, value, nullable=True)
    elif name == "visibility":
        chosen = _choice(name, value, VISIBILITIES)
        if chosen is None:
            raise BadRequest(f"Invalid value for 'visibility': one of {', '.join(VISIBILITIES)}.")
        if chosen == "public" and not ctx.is_admin and image.visibility != "public":
            raise Forbidden(
                "You are not authorized to complete publicize_image action: only admins "
                "make images public."
            )
        image.visibility = chosen
    elif name == "owner":
        if not ctx.is_admin:
            raise Forbidden("Attribute 'owner' is read-only: only admins change it.")
        image.owner = _text(name, value, nullable=True)
    elif name in ("min_ram", "min_disk"):
        setattr(image, name, _count(name, value))
    elif name in ("protected", "os_hidden"):
        setattr(image, name, _flag(name, value))
    elif name == "tags":
        image.tags = _tags(value)
    elif name == "disk_format":
        image.disk_format = _choice(name, value, DISK_FORMATS)
    else:
        image.container_format = _choice(name, value, CONTAINER_FORMATS)


def _apply(ctx: RequestContext, image: ImageChanges, change: Change) -> None:
    name = change.name
    exists = name in BASE or name in image.extra
    if change.op == "add" and change.add_must_be_new and exists:
        raise ConflictingRequest(f"Property {name} already present.")
    if change.op == "remove":
        if name in BASE:
            raise Forbidden(f"Property {name} may not be removed.")
        if name not in image.extra:
            raise ConflictingRequest(f"Property {name} does not exist.")
        del image.extra[name]
        return
    if change.op == "replace" and not exists:
        raise ConflictingRequest(f"Property {name} does not exist.")
    if name in BASE:
        _set_base(ctx, image, name, change.value)
        return
    new = name not in image.extra
    image.extra[name] = _text(name, change.value, nullable=False)
    if new and len(image.extra) > MAX_PROPERTIES:
        raise OverLimit(
            f"Maximum number of image properties exceeded: {len(image.extra)}, at most "
            f"{MAX_PROPERTIES}."
        )


def apply_patch(ctx: RequestContext, image: Image, changes: list[Change]) -> ImageChanges:
    """The image as the changes leave it (in order); a fault at the first that fails."""
    result = ImageChanges.of(image)
    for change in changes:
        _apply(ctx, result, change)
    return result
