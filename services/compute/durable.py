"""Durable file-system updates: what the agent writes survives a crash whole or not at all.

A new file is written under a scratch name, flushed to disk, then given its real name in
one step (a rename, or a hard link when an existing name must never be replaced);
:func:`fsync_dir` makes that step itself durable.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Flush ``directory``'s entries (names created, renamed or removed) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Create ``path`` (it must not exist) holding ``data``, flushed to disk."""
    with path.open("xb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())


def create_once(path: Path, data: bytes, mode: int) -> bool:
    """Atomically create ``path`` holding ``data`` with ``mode``, unless it exists.

    Readers see either no file or the whole of it. Returns ``False``, changing nothing,
    when ``path`` already exists (even if another process created it a moment ago).
    """
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fchmod(stream.fileno(), mode)
            os.fsync(stream.fileno())
        try:
            os.link(scratch, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        os.unlink(scratch)
