"""``keel-manage compute orphans``: guests on hosts that no record explains.

An agent reports every guest it finds on its host. A guest whose instance the database
places on another node, with no evacuation from that host to explain it (or whose
instance keel does not know), is never destroyed: it is listed here, with when it was
first and last seen, for an operator to look at.
"""

from __future__ import annotations

import argparse

from services.manage.commands import set_handler
from services.manage.commands.service import table
from services.manage.database import connect
from shared.config import Settings
from shared.db import orphans

COLUMNS = ("Host", "Node", "Guest (instance)", "Why", "First seen", "Last seen")


async def list_orphans(args: argparse.Namespace, settings: Settings) -> int:
    async with connect(settings.database_url) as conn:
        found = await orphans.list_all(conn, args.host)
    if not found:
        print("no orphaned guests")
        return 0
    print(
        table(
            COLUMNS,
            [
                (
                    o.host,
                    o.hypervisor_hostname,
                    str(o.instance_uuid),
                    o.reason,
                    o.first_seen.isoformat(timespec="seconds"),
                    o.last_seen.isoformat(timespec="seconds"),
                )
                for o in found
            ],
        )
    )
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    compute = commands.add_parser("compute", help="what agents found on their hosts")
    actions = compute.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "orphans",
        help="guests no record explains (never destroyed by keel)",
        description=__doc__,
    )
    listing.add_argument("--host", help="only this compute host")
    set_handler(listing, list_orphans)
