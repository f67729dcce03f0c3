"""``keel-manage image``: register image metadata (data is uploaded through keel-api)."""

from __future__ import annotations

import argparse
import uuid

from services.manage.commands import set_handler
from services.manage.database import connect
from shared.config import Settings
from shared.db import images


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a UUID: {value!r}") from None


def _non_negative(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"not a whole number >= 0: {value!r}")
    return number


async def create(args: argparse.Namespace, settings: Settings) -> int:
    """Register an image and print its id; an id already in use is an error."""
    image_id = args.id or uuid.uuid4()
    async with connect(settings.database_url) as conn:
        image = await images.create(
            conn,
            image_id=image_id,
            name=args.name,
            disk_format=args.disk_format,
            container_format=args.container_format,
            min_disk=args.min_disk,
            min_ram=args.min_ram,
            visibility=args.visibility,
        )
    print(image.id)
    return 0


async def list_(args: argparse.Namespace, settings: Settings) -> int:
    async with connect(settings.database_url) as conn:
        found = await images.list_images(conn, name=args.name)
    for image in found:
        print(f"{image.id}  {image.name or '-':<24} {image.status:<8} {image.visibility}")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    image = commands.add_parser("image", help="image metadata")
    actions = image.add_subparsers(dest="action", required=True, metavar="ACTION")
    new = actions.add_parser("create", help="register an image and print its id")
    new.add_argument("name", metavar="NAME")
    new.add_argument("--id", type=_uuid, help="the image id (default: a new random one)")
    new.add_argument("--min-disk", type=_non_negative, default=0, metavar="GB")
    new.add_argument("--min-ram", type=_non_negative, default=0, metavar="MB")
    new.add_argument("--disk-format", default="qcow2")
    new.add_argument("--container-format", default="bare")
    new.add_argument("--visibility", choices=("public", "private"), default="public")
    set_handler(new, create)
    listing = actions.add_parser("list", help="list registered images")
    listing.add_argument("--name", help="only images with this exact name")
    set_handler(listing, list_)
