"""Where keel-api keeps image data: one file per image in ``KEEL_IMAGES__STORE_DIR``.

An upload streams into ``.upload-<id>-<random>`` and is renamed to ``<id>`` once whole,
so the store never holds part of an image under its name. Every keel-api of a deployment
must see the same store (a shared file system when there are several hosts).
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

UPLOAD_PREFIX = ".upload-"


def data_path(store: Path, image_id: UUID) -> Path:
    return store / str(image_id)


def remove_data(store: Path, image_id: UUID) -> None:
    """Remove a deleted image's data (and any upload of it left behind)."""
    data_path(store, image_id).unlink(missing_ok=True)
    for leftover in store.glob(f"{UPLOAD_PREFIX}{image_id}-*") if store.is_dir() else []:
        leftover.unlink(missing_ok=True)
