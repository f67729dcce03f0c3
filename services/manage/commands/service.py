"""``keel-manage service``: what runs where, whether it is up, and renaming a compute host."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from services.manage.commands import UsageError, set_handler
from services.manage.database import connect
from shared.config import Settings
from shared.db import service_maintenance, services
from shared.objects.service import Service

COLUMNS = ("ID", "Binary", "Host", "Status", "State", "Version", "Last seen up")


def rows(found: Sequence[Service]) -> list[tuple[str, ...]]:
    return [
        (
            str(service.id),
            service.binary,
            service.host,
            "disabled" if service.disabled else "enabled",
            "up" if service.is_up else "down",
            str(service.version),
            service.last_seen_up.isoformat(timespec="seconds") if service.last_seen_up else "never",
        )
        for service in found
    ]


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned table, one line per row."""
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *body)
    ]
    return "\n".join(lines)


async def list_(args: argparse.Namespace, settings: Settings) -> int:
    """Print every live service; down means forced down or no heartbeat for too long."""
    async with connect(settings.database_url) as conn:
        found = await services.list_services(
            conn, settings.service_down_time, host=args.host, binary=args.binary, include_api=True
        )
    if not found:
        print("no services have registered yet")
        return 0
    print(table(COLUMNS, rows(found)))
    return 0


async def rename(args: argparse.Namespace, settings: Settings) -> int:
    """Rename a stopped compute host, with its nodes and servers, in one transaction."""
    if args.old == args.new or not 0 < len(args.new) <= 255 or args.new != args.new.strip():
        raise UsageError(
            f"NEW must be a host name of 1 to 255 characters without surrounding spaces, "
            f"different from OLD; got {args.new!r}"
        )
    async with connect(settings.database_url) as conn:
        done = await service_maintenance.rename_compute(
            conn, args.old, args.new, settings.service_down_time
        )
    print(
        f"renamed compute host {args.old} to {args.new}: service {done.service.uuid}, "
        f"{done.nodes} node(s), {done.instances} server row(s). Start its agent with "
        f"KEEL_HOST={args.new} and the same state directory: it keeps its node, its "
        "servers and its queue."
    )
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    service = commands.add_parser("service", help="services and their state")
    actions = service.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list",
        help="list services with up/down state",
        description="A service is down when forced down or when its last heartbeat is "
        "older than KEEL_SERVICE_DOWN_TIME seconds.",
    )
    listing.add_argument("--host", help="only services on this host")
    listing.add_argument("--binary", help="only this binary, e.g. keel-compute")
    set_handler(listing, list_)
    renaming = actions.add_parser(
        "rename",
        help="rename a stopped compute host",
        description="Rename compute host OLD to NEW: its service, compute nodes and "
        "servers, in one transaction. Only while OLD's agent is stopped (no heartbeat for "
        "KEEL_SERVICE_DOWN_TIME seconds), and only if NEW has no compute service. Then "
        "start the agent with KEEL_HOST=NEW and its old state directory.",
    )
    renaming.add_argument("old", metavar="OLD", help="the compute host's current name")
    renaming.add_argument("new", metavar="NEW", help="its new name")
    set_handler(renaming, rename)
