"""Server backups (``createBackup``): a snapshot that rotates its server's backups.

A backup is a server snapshot (:mod:`shared.db.snapshots`) whose image says
``image_type=backup`` and ``backup_type=T`` and whose row keeps the request's rotation
``R`` (``images.backup_rotation``). When its data is whole (keel-api makes it
``active``, in the same transaction), :func:`rotate` keeps the newest ``R`` of the
server's images of that ``backup_type`` (not deleted, by ``created_at``) and deletes the
rest, as Nova's ``_rotate_backups`` does: ``R`` 0 deletes them all, the new one
included. A ``protected`` backup is never deleted, but it still counts among the
backups kept or in excess (Nova's rotation asks the Image API to delete each excess
backup, is refused for a protected one and goes on): it stays, and the rotation keeps
fewer than ``R`` unprotected ones behind it. Only images of the backup's own project
count: an image another project registered with the same properties is never deleted
by a rotation.

A backup made whole by an older keel-api rotated nothing; the next backup's rotation
deletes that excess too, since it counts every backup of the kind.

Rotations of one server and backup type take turns (a transaction-scoped advisory
lock), and each deletes only rows not deleted yet: two at once, or one run again,
delete each excess backup once and never more than the excess.
"""

from __future__ import annotations

from uuid import UUID

from shared.db import images
from shared.db.pool import Connection

#: What a backup's ``image_type`` property says.
IMAGE_TYPE = "backup"


async def rotate(conn: Connection, image_id: UUID) -> list[UUID]:
    """Rotate the backups of the server ``image_id`` is a backup of (in the caller's
    transaction); the ids of the images deleted (none if it is no backup, or gone)."""
    row = await conn.fetchrow(
        """SELECT backup_rotation, owner, properties->>'instance_uuid' AS instance_uuid,
                  properties->>'backup_type' AS backup_type
             FROM images
            WHERE id = $1 AND backup_rotation IS NOT NULL
              AND properties->>'image_type' = $2""",
        image_id,
        IMAGE_TYPE,
    )
    if row is None or row["instance_uuid"] is None or row["backup_type"] is None:
        return []
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtext('keel-backup-rotation:' || $1 || ':' || $2))",
        row["instance_uuid"],
        row["backup_type"],
    )
    rows = await conn.fetch(
        f"""UPDATE images SET deleted_at = now(), upload_token = NULL, updated_at = now()
            WHERE deleted_at IS NULL AND {images.UNPROTECTED} AND id IN (
                    SELECT id FROM images
                     WHERE deleted_at IS NULL
                       AND properties->>'image_type' = $1
                       AND properties->>'instance_uuid' = $2
                       AND properties->>'backup_type' = $3
                       AND owner IS NOT DISTINCT FROM $5
                     ORDER BY created_at DESC, id DESC
                    OFFSET $4)
        RETURNING id""",
        IMAGE_TYPE,
        row["instance_uuid"],
        row["backup_type"],
        row["backup_rotation"],
        row["owner"],
    )
    return [r["id"] for r in rows]
