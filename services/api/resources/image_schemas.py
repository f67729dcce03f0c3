"""``/image/v2/schemas/image`` and ``/image/v2/schemas/images``: JSON schemas of image bodies.

Every image body points at ``/v2/schemas/image`` (and every list at
``/v2/schemas/images``), as Glance's do; python-glanceclient fetches the schema to build
the model it reads and validates images with, so an image command (or a tool built on
the client, as Rally's image validation is) fails without it. The schema describes the
bodies :mod:`services.api.views.images` answers: the base properties with their types
(nullable where keel may answer ``null``), and extra properties as strings, which is
what keel's image registration accepts.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.auth import Context

router = APIRouter(prefix="/schemas")

STATUSES = ("queued", "saving", "active", "killed", "deleted", "uploading", "importing",
            "pending_delete", "deactivated")  # fmt: skip
VISIBILITIES = ("public", "private", "shared", "community")
DISK_FORMATS = ("ami", "ari", "aki", "vhd", "vhdx", "vmdk", "raw", "qcow2", "vdi", "iso",
                "ploop")  # fmt: skip
CONTAINER_FORMATS = ("ami", "ari", "aki", "bare", "ovf", "ova", "docker", "compressed")

_ID = {"type": "string", "pattern": "^([0-9a-fA-F]){8}-([0-9a-fA-F]){4}-([0-9a-fA-F]){4}"
       "-([0-9a-fA-F]){4}-([0-9a-fA-F]){12}$"}  # fmt: skip


def _text(description: str, *, nullable: bool = False, read_only: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": ["null", "string"] if nullable else "string",
        "description": description,
    }
    if not nullable:
        schema["maxLength"] = 255
    if read_only:
        schema["readOnly"] = True
    return schema


def _count(description: str, *, nullable: bool = False) -> dict[str, Any]:
    return {
        "type": ["null", "integer"] if nullable else "integer",
        "description": description,
        "readOnly": True,
    }


def _choice(description: str, values: tuple[str, ...]) -> dict[str, Any]:
    return {"type": ["null", "string"], "description": description, "enum": [None, *values]}


def image_properties() -> dict[str, Any]:
    """The base properties of an image body, by name."""
    return {
        "id": {**_ID, "description": "An identifier for the image"},
        "name": _text("Descriptive name for the image", nullable=True),
        "status": {
            "type": "string",
            "readOnly": True,
            "enum": list(STATUSES),
            "description": "Status of the image",
        },
        "visibility": {
            "type": "string",
            "enum": list(VISIBILITIES),
            "description": "Scope of image accessibility",
        },
        "protected": {"type": "boolean", "description": "If true, image will not be deletable."},
        "os_hidden": {
            "type": "boolean",
            "description": "If true, image will not appear in default image list response.",
        },
        "checksum": _text("md5 hash of image contents.", nullable=True, read_only=True),
        "os_hash_algo": _text("Algorithm of os_hash_value", nullable=True, read_only=True),
        "os_hash_value": _text("Hexdigest of the image contents", nullable=True, read_only=True),
        "owner": _text("Owner of the image", nullable=True),
        "size": _count("Size of image file in bytes", nullable=True),
        "virtual_size": _count("Virtual size of image in bytes", nullable=True),
        "container_format": _choice("Format of the container", CONTAINER_FORMATS),
        "disk_format": _choice("Format of the disk", DISK_FORMATS),
        "created_at": _text("Date and time of image registration", read_only=True),
        "updated_at": _text("Date and time of the last image modification", read_only=True),
        "tags": {
            "type": "array",
            "description": "List of strings related to the image",
            "items": {"type": "string", "maxLength": 255},
        },
        "min_ram": {
            "type": "integer",
            "description": "Amount of ram (in MB) required to boot image.",
        },
        "min_disk": {
            "type": "integer",
            "description": "Amount of disk space (in GB) required to boot image.",
        },
        "self": _text("An image self url", read_only=True),
        "file": _text("An image file url", read_only=True),
        "schema": _text("An image schema url", read_only=True),
        "direct_url": _text("URL to access the image file kept in external store", read_only=True),
        "locations": {
            "type": "array",
            "description": "A set of URLs to access the image file",
            "items": {"type": "object"},
        },
        "kernel_id": {
            "type": ["null", "string"],
            "description": "ID of image stored in Glance "
            "that should be used as the kernel when booting an AMI-style image.",
        },
        "ramdisk_id": {
            "type": ["null", "string"],
            "description": "ID of image stored in Glance "
            "that should be used as the ramdisk when booting an AMI-style image.",
        },
        "instance_uuid": _text(
            "Metadata which can be used to record which instance this image is associated with."
        ),
        "architecture": _text("Operating system architecture"),
        "os_distro": _text("Common name of operating system distribution"),
        "os_version": _text("Operating system version as specified by the distributor"),
    }


def image_schema() -> dict[str, Any]:
    return {
        "name": "image",
        "properties": image_properties(),
        "additionalProperties": {"type": "string"},
        "links": [
            {"rel": "self", "href": "{self}"},
            {"rel": "enclosure", "href": "{file}"},
            {"rel": "describedby", "href": "{schema}"},
        ],
    }


def images_schema() -> dict[str, Any]:
    return {
        "name": "images",
        "properties": {
            "images": {"type": "array", "items": image_schema()},
            "schema": {"type": "string"},
            "first": {"type": "string"},
            "next": {"type": "string"},
        },
        "links": [
            {"rel": "first", "href": "{first}"},
            {"rel": "next", "href": "{next}"},
            {"rel": "describedby", "href": "{schema}"},
        ],
    }


@router.get("/image")
async def show_image_schema(ctx: Context) -> dict[str, Any]:
    return image_schema()


@router.get("/images")
async def show_images_schema(ctx: Context) -> dict[str, Any]:
    return images_schema()
