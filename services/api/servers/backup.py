"""``POST /servers/{id}/action {"createBackup": {"name": ..., "backup_type": ...,
"rotation": ..., "metadata": {...}}}``: a snapshot that keeps the newest ``rotation``
backups of its kind.

A backup is taken as a ``createImage`` snapshot is (:mod:`.snapshot`: the same state,
lock, host, signing and RPC caps refusals, the same 202 answers before and from 2.45),
recorded as the instance action ``createBackup``. The body is Nova's schema: ``name``
(1 to 255 characters, no surrounding whitespace), ``backup_type`` (a string),
``rotation`` (an integer from 0, or a string of digits, as Nova's
``non_negative_integer``) and optional ``metadata``; anything else is a 400.

The image is a snapshot's, with ``image_type=backup`` and ``backup_type`` over the
request's metadata (as Nova sets them), and the rotation kept in its row. Once its data
is whole, keel-api deletes the server's backups of that type beyond the newest
``rotation`` (:mod:`shared.db.backups`).
"""

from __future__ import annotations

from typing import Annotated, Any

import asyncpg
from fastapi import Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictStr, ValidationError

from services.api.http.faults import BadRequest
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.servers.fields import Metadata, ServerName
from services.api.servers.snapshot import SnapshotImage, take_snapshot
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.db import backups
from shared.objects.instance import Instance

ACTION = "createBackup"

#: Nova's ``non_negative_integer`` (a rotation): a JSON integer, or a string of digits.
_MAX_ROTATION = 2**31 - 1


def _non_negative_integer(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("must be a non-negative integer")
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or value < 0:
        raise ValueError("must be a non-negative integer")
    if value > _MAX_ROTATION:
        raise ValueError(f"must be at most {_MAX_ROTATION}")
    return value


Rotation = Annotated[int, BeforeValidator(_non_negative_integer)]


class CreateBackupRequest(BaseModel):
    """The ``createBackup`` value, as Nova's schema has it (anything else is a 400)."""

    model_config = ConfigDict(extra="forbid")

    name: ServerName
    backup_type: StrictStr
    rotation: Rotation
    metadata: Metadata | None = None


def parse(value: Any) -> CreateBackupRequest:
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute createBackup: it must be an object.")
    try:
        return CreateBackupRequest.model_validate(value)
    except ValidationError as exc:
        errors = [{**error, "loc": ("createBackup", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None


async def create_backup(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    version: APIVersion,
    links: Links,
    instance: Instance,
    value: Any,
) -> Response:
    """Check, record, cast; the 202 answer (see the module docstring)."""
    request = parse(value)
    image = SnapshotImage(
        name=request.name,
        metadata=request.metadata,
        over={"image_type": backups.IMAGE_TYPE, "backup_type": request.backup_type},
        action=ACTION,
        rotation=request.rotation,
    )
    return await take_snapshot(
        pool,
        compute,
        conductor,
        settings=settings,
        ctx=ctx,
        version=version,
        links=links,
        instance=instance,
        image=image,
    )
