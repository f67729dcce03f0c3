"""The node identity file: the compute node's UUID, kept on the host's own disk.

``<state_dir>/compute_id`` holds one UUID. It is the agent's only claim to its compute
node record, so it is created once and never replaced: a deployment tool may write it
before the first start (it is then honoured as it is), and keel writes it only when no
file exists. A file that is present but does not hold a UUID stops the agent with a
message saying so; generating a fresh identity instead would orphan every guest the old
node record accounts for.

The file is written atomically (a temporary file, fsync, then a hard link that fails if
the name already exists), so a crash never leaves a half-written identity and two agents
started at once on one state directory end up with the same UUID.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from uuid import UUID

from services.compute.durable import create_once
from shared.exceptions import ConfigError

LOG = logging.getLogger(__name__)

COMPUTE_ID_FILE = "compute_id"
_FILE_MODE = 0o644
_MAX_SIZE = 4096


def compute_id_path(state_dir: Path) -> Path:
    return state_dir / COMPUTE_ID_FILE


def read_compute_id(state_dir: Path) -> UUID | None:
    """The UUID in the identity file; ``None`` if there is no file.

    Raises :class:`ConfigError` if the file exists but cannot be read or is not a UUID.
    """
    path = compute_id_path(state_dir)
    try:
        with path.open("rb") as stream:
            raw = stream.read(_MAX_SIZE + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(
            f"cannot read the node identity file {path}: {exc.strerror}; "
            "fix its permissions or type (it must be a regular file readable by keel-compute)"
        ) from None
    return _parse(path, raw)


def _parse(path: Path, raw: bytes) -> UUID:
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        if len(raw) > _MAX_SIZE or not text or len(text.split()) != 1:
            raise ValueError(text)
        return UUID(text)
    except ValueError:
        shown = text[:60] + ("…" if len(text) > 60 else "")
        raise ConfigError(
            f"the node identity file {path} is corrupt: expected one UUID, found {shown!r}. "
            "keel-compute will not replace it, because a new identity would orphan this "
            "node's guests; restore the file (the node's UUID is shown by "
            "`openstack hypervisor show`), then start the agent again"
        ) from None


def write_compute_id(state_dir: Path, node_uuid: UUID) -> UUID:
    """Write ``node_uuid`` as the identity unless a file already exists.

    Returns the identity now on disk: ``node_uuid``, or the one already there (possibly
    written a moment ago by another process). Creates ``state_dir`` if needed.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    path = compute_id_path(state_dir)
    if create_once(path, f"{node_uuid}\n".encode(), _FILE_MODE):
        return node_uuid
    existing = read_compute_id(state_dir)
    if existing is None:
        raise ConfigError(f"the node identity file {path} vanished while it was being written")
    return existing


def load_or_create(state_dir: Path) -> UUID:
    """The node's UUID: read from the identity file, or generated and written once."""
    path = compute_id_path(state_dir)
    existing = read_compute_id(state_dir)
    if existing is not None:
        LOG.info("node identity %s read from %s", existing, path, extra={"decision": "reuse"})
        return existing
    generated = uuid.uuid4()
    node_uuid = write_compute_id(state_dir, generated)
    if node_uuid != generated:
        LOG.info("node identity %s was written to %s by another process", node_uuid, path)
        return node_uuid
    LOG.info(
        "no node identity file at %s: this host starts as a new compute node %s",
        path,
        node_uuid,
        extra={"decision": "create"},
    )
    return node_uuid
