"""Queries on ``images`` (metadata only)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import Conflict, ImageNotFound
from shared.objects.image import Image


async def get(conn: Connection, image_id: UUID) -> Image:
    row = await conn.fetchrow("SELECT * FROM images WHERE id = $1 AND deleted_at IS NULL", image_id)
    if row is None:
        raise ImageNotFound(f"Image {image_id} could not be found.")
    return Image.from_row(row)


async def list_images(
    conn: Connection, *, name: str | None = None, ids: list[UUID] | None = None
) -> list[Image]:
    rows = await conn.fetch(
        """SELECT * FROM images
            WHERE deleted_at IS NULL
              AND ($1::text IS NULL OR name = $1)
              AND ($2::uuid[] IS NULL OR id = ANY($2))
            ORDER BY created_at, id""",
        name,
        ids,
    )
    return [Image.from_row(row) for row in rows]


async def create(
    conn: Connection,
    *,
    image_id: UUID,
    name: str,
    disk_format: str | None = "qcow2",
    container_format: str | None = "bare",
    min_disk: int = 0,
    min_ram: int = 0,
    size: int | None = None,
    owner: str | None = None,
    visibility: str = "public",
    properties: dict[str, Any] | None = None,
) -> Image:
    try:
        row = await conn.fetchrow(
            """INSERT INTO images (id, name, disk_format, container_format, min_disk, min_ram,
                                   size, owner, visibility, properties)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING *""",
            image_id,
            name,
            disk_format,
            container_format,
            min_disk,
            min_ram,
            size,
            owner,
            visibility,
            properties or {},
        )
    except asyncpg.UniqueViolationError:
        raise Conflict(f"Image {image_id} already exists.") from None
    assert row is not None
    return Image.from_row(row)


async def delete(conn: Connection, image_id: UUID) -> None:
    status = await conn.execute(
        "UPDATE images SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL", image_id
    )
    if status == "UPDATE 0":
        raise ImageNotFound(f"Image {image_id} could not be found.")
