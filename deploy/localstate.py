"""What a local cloud (``make run``) leaves behind, and how to start over (``make clean``).

A local cloud keeps its state in two places: the database named in ``KEEL_DATABASE_URL``
and the work directory (``.keel/``: clouds.yaml, logs, and each agent's state directory
with its node identity file). When the two disagree — another checkout ran a cloud on the
same database, or ``.keel/`` was deleted — the agents would be refused at start-up, as
they should be. :func:`foreign_hosts` notices that first, so ``make run`` can say what is
wrong and how out; :func:`clean` drops the database and the work directory, after saying
what it removes, unless this checkout's cloud is running (see :func:`running_pid`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.compute import identity
from services.manage.database import connect, database_name, drop_database, server_of
from shared.config import Settings
from shared.exceptions import ConfigError, KeelError

#: Where ``make run`` records its process id while the cloud runs.
PID_FILE = "run.pid"


@dataclass(frozen=True)
class ForeignHost:
    """A compute host in the database whose identity is not in this checkout."""

    host: str
    node_uuid: str
    service_uuid: str
    is_up: bool
    #: What this checkout's state directory holds instead.
    here: str


def _local_identity(state_dir: Path) -> str:
    try:
        found = identity.read_compute_id(state_dir)
    except ConfigError:
        return "an unreadable identity file"
    return "no identity file" if found is None else f"node {found}"


async def foreign_hosts(
    settings: Settings, workdir: Path, hosts: tuple[str, ...]
) -> list[ForeignHost]:
    """This checkout's compute hosts that the database knows with another node identity."""
    async with connect(settings.database_url) as conn:
        rows = await conn.fetch(
            """SELECT s.host, s.uuid AS service_uuid, n.uuid AS node_uuid,
                      (NOT s.forced_down AND s.last_seen_up IS NOT NULL
                       AND s.last_seen_up > now() - make_interval(secs => $1)) AS is_up
                 FROM services s JOIN compute_nodes n ON n.service_id = s.id
                WHERE s."binary" = 'keel-compute' AND s.deleted_at IS NULL
                  AND n.deleted_at IS NULL AND s.host = ANY($2::text[])
                ORDER BY s.host, n.id""",
            settings.service_down_time,
            list(hosts),
        )
    foreign = []
    for row in rows:
        here = _local_identity(workdir / row["host"])
        if here != f"node {row['node_uuid']}":
            foreign.append(
                ForeignHost(
                    host=row["host"],
                    node_uuid=str(row["node_uuid"]),
                    service_uuid=str(row["service_uuid"]),
                    is_up=row["is_up"],
                    here=here,
                )
            )
    return foreign


def explain_foreign(settings: Settings, workdir: Path, foreign: list[ForeignHost]) -> str:
    """What is wrong and the ways out, for ``make run`` to print."""
    database = f"{database_name(settings.database_url)} on {server_of(settings.database_url)}"
    lines = [
        f"the database {database} already has compute hosts whose node identity files are "
        f"not in this checkout's state directories ({workdir}/<host>/compute_id):"
    ]
    for host in foreign:
        state = "up: another cloud is running with this database" if host.is_up else "down"
        lines.append(
            f"  {host.host}: node {host.node_uuid} (service {host.service_uuid}, {state}); "
            f"{workdir / host.host} has {host.here}"
        )
    lines += [
        "Another checkout (or a deleted .keel/) registered them, so this checkout's agents "
        "would be refused. Ways out:",
        "  make clean && make run      drop this database and .keel/, then start afresh",
        "  KEEL_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/keel2 make run",
        "                              use a database of this checkout's own",
        "  from the checkout that owns them: stop its cloud, then "
        "`openstack compute service delete <service>` for each",
    ]
    return "\n".join(lines)


def running_pid(workdir: Path) -> int | None:
    """The pid of this checkout's ``make run`` if it is running."""
    try:
        pid = int((workdir / PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"localcloud.py" in cmdline else None


def record_pid(workdir: Path) -> None:
    (workdir / PID_FILE).write_text(f"{os.getpid()}\n")


def forget_pid(workdir: Path) -> None:
    (workdir / PID_FILE).unlink(missing_ok=True)


def _contents(workdir: Path) -> list[str]:
    described = []
    for entry in sorted(workdir.iterdir()):
        if entry.is_dir() and (entry / identity.COMPUTE_ID_FILE).exists():
            described.append(f"{entry.name}/ (agent state, {_local_identity(entry)})")
        else:
            described.append(entry.name + ("/" if entry.is_dir() else ""))
    return described


def destroy_guests(settings: Settings, workdir: Path) -> list[str]:
    """Destroy and undefine the libvirt domains of this checkout's agents (their disks
    are about to go); the names destroyed. Nothing without the libvirt driver."""
    if settings.compute.driver != "libvirt":
        return []
    import libvirt  # noqa: PLC0415 - only with the libvirt driver

    prefixes = []
    for id_file in workdir.glob("*/compute_id"):
        with contextlib.suppress(ValueError, OSError):
            prefixes.append(f"keel-{uuid.UUID(id_file.read_text().strip()).hex[:8]}-")
    if not prefixes:
        return []
    conn = libvirt.open(settings.libvirt.uri)
    destroyed = []
    try:
        for dom in conn.listAllDomains(0):
            if dom.name().startswith(tuple(prefixes)):
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
                destroyed.append(dom.name())
    finally:
        conn.close()
    return destroyed


def clean(settings: Settings, workdir: Path, say: Callable[[str], None]) -> None:
    """Drop the local database and the work directory, saying what goes first."""
    pid = running_pid(workdir)
    if pid is not None:
        raise KeelError(
            f"this checkout's local cloud is running (pid {pid}); stop it (Ctrl-C in its "
            "terminal) before `make clean`"
        )
    url = settings.database_url
    database = f"database {database_name(url)} on {server_of(url)}"
    say(f"removing {database} (every server, service, user and image in it)")
    if asyncio.run(drop_database(url)):
        say(f"dropped {database}")
    else:
        say(f"{database} did not exist")
    if workdir.exists():
        for name in destroy_guests(settings, workdir):
            say(f"destroyed libvirt domain {name} (its disks are in {workdir}/)")
        say(f"removing {workdir}/: {', '.join(_contents(workdir)) or 'empty'}")
        shutil.rmtree(workdir)
    else:
        say(f"{workdir}/ did not exist")
