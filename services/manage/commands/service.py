"""``keel-manage service``: what runs where, and whether it is up."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from services.manage.commands import set_handler
from services.manage.database import connect
from shared.config import Settings
from shared.db import services
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
