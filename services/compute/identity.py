"""The node identity file: the compute node's UUID, kept on the host's own disk.

``<state_dir>/compute_id`` holds one UUID. It is the agent's only claim to its compute
node record, so it is created once and never replaced. A deployment tool may provision
it before the first start, in the state directory or beside the ``--config`` file
(``<config dir>/compute_id``); every copy present is read, and they must agree.

A copy that is present but does not hold a UUID, or copies that disagree, stop the
agent with a message naming the files: generating a fresh identity instead would orphan
every guest the old node record accounts for.

keel writes the file only when no copy exists, and only after the conductor said what
the database knows about this host (see :mod:`services.compute.agent`). It is written
atomically (a temporary file, fsync, then a hard link that fails if the name already
exists), so a crash never leaves a half-written identity and two agents started at once
on one state directory end up with the same UUID.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from services.compute.durable import create_once
from shared.exceptions import ConfigError, HypervisorInUse

LOG = logging.getLogger(__name__)

COMPUTE_ID_FILE = "compute_id"
#: Where every driver keeps its guests' files: ``<state dir>/instances/<uuid>/``.
GUESTS_DIR = "instances"
#: Guests named in a refusal; all are counted.
GUESTS_SHOWN = 5
_FILE_MODE = 0o644
_MAX_SIZE = 4096


def compute_id_path(directory: Path) -> Path:
    return directory / COMPUTE_ID_FILE


@dataclass(frozen=True)
class NodeIdentity:
    """What the identity files say: the UUID (``None`` when there is no copy) and where."""

    #: Where keel writes the identity: ``<state dir>/compute_id``.
    state_file: Path
    #: Every copy that was looked for, in the order read (state directory first).
    candidates: tuple[Path, ...]
    #: The copies found, all holding :attr:`node_uuid`.
    found: tuple[Path, ...] = ()
    node_uuid: UUID | None = None

    def describe(self) -> str:
        """The files that hold the identity, or where it would be, for messages."""
        return " and ".join(str(p) for p in self.found or (self.state_file,))


def read_compute_id(directory: Path) -> UUID | None:
    """The UUID in ``<directory>/compute_id``; ``None`` if there is no file.

    Raises :class:`ConfigError` if the file exists but cannot be read or is not a UUID.
    """
    return _read(compute_id_path(directory))


def _read(path: Path) -> UUID | None:
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
            "node's guests; restore the file (the node's UUID is this host's hypervisor ID in "
            "`openstack hypervisor list`), then start the agent again"
        ) from None


def read_identity(state_dir: Path, config_file: Path | None = None) -> NodeIdentity:
    """Read every copy of the identity: in ``state_dir`` and beside ``config_file``.

    Raises :class:`ConfigError` naming the files when a copy is unreadable or corrupt,
    or when copies disagree.
    """
    state_file = compute_id_path(state_dir)
    candidates = [state_file]
    if config_file is not None:
        beside = compute_id_path(config_file.resolve().parent)
        if beside.resolve() != state_file.resolve():
            candidates.append(beside)
    values = [(path, _read(path)) for path in candidates]
    found = [(path, value) for path, value in values if value is not None]
    distinct = {value for _, value in found}
    if len(distinct) > 1:
        listed = "; ".join(f"{path} holds {value}" for path, value in found)
        raise ConfigError(
            f"the node identity files disagree: {listed}. keel-compute will not guess which "
            "node this host is; keep the copy holding this host's hypervisor ID in `openstack "
            "hypervisor list`, make the other copy match it (or remove it), then start the "
            "agent again"
        )
    return NodeIdentity(
        state_file=state_file,
        candidates=tuple(candidates),
        found=tuple(path for path, _ in found),
        node_uuid=found[0][1] if found else None,
    )


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


def create_identity(state_dir: Path, node_uuid: UUID) -> UUID:
    """Write the identity the conductor agreed to; refuse if another process won a race."""
    on_disk = write_compute_id(state_dir, node_uuid)
    path = compute_id_path(state_dir)
    if on_disk != node_uuid:
        raise ConfigError(
            f"another process wrote the node identity file {path} ({on_disk}) while this "
            "agent was starting; make sure only one keel-compute uses this state directory, "
            "then start the agent again"
        )
    LOG.info("wrote node identity %s to %s", node_uuid, path, extra={"decision": "create"})
    return node_uuid


def guests_in(state_dir: Path) -> list[UUID]:
    """The guests whose files are in the state directory (``instances/<uuid>/``), sorted.

    Read before the agent knows its node, so it does not ask the driver: every driver
    keeps a guest's files there, whichever node made it.
    """
    try:
        entries = list((state_dir / GUESTS_DIR).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        try:
            guest = UUID(entry.name)
        except ValueError:
            continue  # scratch directories of a build or a removal cut short
        if entry.is_dir():
            found.append(guest)
    return sorted(found)


def refuse_new_node_holding(host: str, state_dir: Path, guests: list[UUID]) -> None:
    """Refuse to start as a node new to the database while guests are already here.

    Registering would keep them as orphans beside the records of the node they belong
    to: the machine is more likely a known host under a new name that lost its identity
    file, or has a state directory copied from another host.
    """
    if not guests:
        return
    shown = ", ".join(str(guest) for guest in guests[:GUESTS_SHOWN])
    more = f" and {len(guests) - GUESTS_SHOWN} more" if len(guests) > GUESTS_SHOWN else ""
    raise HypervisorInUse(
        f"a new service whose hypervisor already holds instances: host {host!r} is new to "
        f"the database, but {state_dir / GUESTS_DIR} holds {len(guests)} guest(s): "
        f"{shown}{more}. Nothing was changed: a new compute node here would keep them as "
        "orphans. If this machine was another compute host and lost its node identity file "
        "(or its state directory was copied here), restore that host's identity file and "
        "KEEL_HOST, or rename that host (`keel-manage service rename OLD NEW` while its "
        "agent is stopped); `openstack server show UUID` names a server's host. If no server "
        "needs these guests, remove them. Then start the agent again."
    )
