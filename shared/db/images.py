"""Queries on ``images``: metadata, and the state of an image's data upload.

An upload is a compare-and-swap from an image without data (``queued``, or ``active``
registered without data) to ``saving`` under a fresh token; only the holder of the token
may finish it (``active`` with its size and hashes) or give it back. While it streams it
touches ``updated_at``; an upload silent for :data:`STALE_UPLOAD_SECONDS` (its keel-api
died) may be taken over by a new one.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import Conflict, ImageNotFound, ImageProtected
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
    status: str = "active",
    backup_rotation: int | None = None,
) -> Image:
    try:
        row = await conn.fetchrow(
            """INSERT INTO images (id, name, disk_format, container_format, min_disk, min_ram,
                                   size, owner, visibility, properties, status,
                                   backup_rotation)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING *""",
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
            status,
            backup_rotation,
        )
    except asyncpg.UniqueViolationError:
        raise Conflict(f"Image {image_id} already exists.") from None
    assert row is not None
    return Image.from_row(row)


#: The SQL condition of an image that may be deleted: not ``protected``.
UNPROTECTED = "COALESCE(properties->>'protected', 'false') <> 'true'"


async def delete(conn: Connection, image_id: UUID) -> None:
    """Delete the image; :class:`ImageProtected` if it is protected (as the Image API
    refuses it to everyone, admins included), :class:`ImageNotFound` if it is gone."""
    row = await conn.fetchrow(
        f"""UPDATE images SET deleted_at = CASE WHEN {UNPROTECTED} THEN now() END
             WHERE id = $1 AND deleted_at IS NULL
         RETURNING deleted_at IS NOT NULL AS deleted""",
        image_id,
    )
    if row is None:
        raise ImageNotFound(f"Image {image_id} could not be found.")
    if not row["deleted"]:
        raise ImageProtected.of(image_id)


#: Seconds after which a ``saving`` image whose upload stopped touching it may be taken.
STALE_UPLOAD_SECONDS = 300


async def begin_upload(conn: Connection, image_id: UUID) -> tuple[UUID, str] | None:
    """Swap an image without data to ``saving``; its upload token and former status.

    ``None`` when the image has data, or another live upload holds it.
    """
    token = uuid4()
    row = await conn.fetchrow(
        """UPDATE images i SET status = 'saving', upload_token = $2, updated_at = now()
             FROM (SELECT id, status AS before FROM images WHERE id = $1 FOR UPDATE) old
            WHERE i.id = old.id AND i.deleted_at IS NULL
              AND (i.status = 'queued'
                   OR (i.status = 'active' AND i.checksum IS NULL AND i.size IS NULL)
                   OR (i.status = 'saving'
                       AND i.updated_at < now() - make_interval(secs => $3)))
        RETURNING old.before""",
        image_id,
        token,
        float(STALE_UPLOAD_SECONDS),
    )
    if row is None:
        return None
    before: str = row["before"]
    return token, "queued" if before == "saving" else before


async def touch_upload(conn: Connection, image_id: UUID, token: UUID) -> bool:
    """Keep an upload fresh; ``False`` if it no longer holds the image."""
    status = await conn.execute(
        "UPDATE images SET updated_at = now() WHERE id = $1 AND upload_token = $2",
        image_id,
        token,
    )
    return status != "UPDATE 0"


async def finish_upload(
    conn: Connection,
    image_id: UUID,
    token: UUID,
    *,
    size: int,
    checksum: str,
    os_hash_value: str,
) -> Image | None:
    """The upload is whole: ``saving`` → ``active`` with the data's size and hashes."""
    row = await conn.fetchrow(
        """UPDATE images SET status = 'active', size = $3, checksum = $4,
                             os_hash_algo = 'sha512', os_hash_value = $5,
                             upload_token = NULL, updated_at = now()
            WHERE id = $1 AND upload_token = $2 AND deleted_at IS NULL RETURNING *""",
        image_id,
        token,
        size,
        checksum,
        os_hash_value,
    )
    return None if row is None else Image.from_row(row)


async def abandon_upload(conn: Connection, image_id: UUID, token: UUID, status: str) -> None:
    """Give a failed upload's image back in the status it had before."""
    await conn.execute(
        """UPDATE images SET status = $3, upload_token = NULL, updated_at = now()
            WHERE id = $1 AND upload_token = $2""",
        image_id,
        token,
        status,
    )


async def get_for_update(conn: Connection, image_id: UUID) -> Image:
    """The image, locked until the caller's transaction ends (its properties' writers
    then take turns)."""
    row = await conn.fetchrow(
        "SELECT * FROM images WHERE id = $1 AND deleted_at IS NULL FOR UPDATE", image_id
    )
    if row is None:
        raise ImageNotFound(f"Image {image_id} could not be found.")
    return Image.from_row(row)


#: The columns :func:`update` sets (its keyword arguments).
UPDATABLE = (
    "name",
    "visibility",
    "owner",
    "min_ram",
    "min_disk",
    "disk_format",
    "container_format",
    "properties",
)


async def update(conn: Connection, image_id: UUID, **values: Any) -> Image:
    """Set the image's :data:`UPDATABLE` columns given (after :func:`get_for_update`, in
    its transaction)."""
    unknown = set(values) - set(UPDATABLE)
    if unknown:
        raise ValueError(f"not updatable image columns: {sorted(unknown)}")
    names = list(values)
    assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=2))
    row = await conn.fetchrow(
        f"""UPDATE images SET {assignments}, updated_at = now()
             WHERE id = $1 AND deleted_at IS NULL RETURNING *""",
        image_id,
        *(values[name] for name in names),
    )
    if row is None:
        raise ImageNotFound(f"Image {image_id} could not be found.")
    return Image.from_row(row)


async def set_properties(conn: Connection, image_id: UUID, properties: dict[str, Any]) -> Image:
    """Replace the image's properties (after :func:`get_for_update`, in its transaction)."""
    row = await conn.fetchrow(
        """UPDATE images SET properties = $2, updated_at = now()
            WHERE id = $1 AND deleted_at IS NULL RETURNING *""",
        image_id,
        properties,
    )
    if row is None:
        raise ImageNotFound(f"Image {image_id} could not be found.")
    return Image.from_row(row)
