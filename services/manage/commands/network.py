"""``keel-manage network show``: the network servers get addresses from, and how full it is."""

from __future__ import annotations

import argparse

from services.manage.commands import set_handler
from services.manage.database import connect
from shared.config import Settings
from shared.db import fixed_ips


async def show(args: argparse.Namespace, settings: Settings) -> int:
    """Print the configured network (filling its pool first if keel-api has not yet)."""
    network = settings.network
    first, last = fixed_ips.usable_range(network)
    async with connect(settings.database_url) as conn:
        usage = await fixed_ips.ensure_network(conn, network)
    lines = [
        ("id", str(network.network_id)),
        ("name", network.name),
        ("cidr", network.cidr),
        ("gateway", str(network.network.network_address + 1)),
        ("addresses", f"{first} to {last}"),
        ("in use", str(usage.total - usage.free)),
        ("free", str(usage.free)),
    ]
    width = max(len(label) for label, _ in lines)
    print("\n".join(f"{label.ljust(width)}  {value}" for label, value in lines))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    network = commands.add_parser("network", help="the network servers get addresses from")
    actions = network.add_subparsers(dest="action", required=True, metavar="ACTION")
    showing = actions.add_parser(
        "show",
        help="show the network's id, range and free addresses",
        description="The network comes from the KEEL_NETWORK__* settings; its id is what "
        "clients give as networks: [{uuid: ...}] (openstack server create --nic net-id=ID).",
    )
    set_handler(showing, show)
