"""``keel-manage placement audit [--delete]``: claims nothing justifies, claims missing.

Reads ``allocations`` against the servers and moves they serve (the rules are in
:mod:`shared.db.placement_audit`) and prints:

* the **leaks**: claims no live server or move justifies — with ``--delete`` each is
  removed (a compare-and-swap: only if it is still a leak) and its node's usage given
  back, each logged;
* claims **held for an operator**: kept by a move that ended in error while its server
  is in ERROR; never removed here (resolve the server first);
* servers and moves **missing** their claims: listed, never created here (a claim made
  after the fact could exceed a node's capacity);
* nodes whose usage is not the sum of their claims.

Exit code: 0 when nothing is left to look at, 1 when something is (after ``--delete``,
what it did not remove).
"""

from __future__ import annotations

import argparse

from services.manage.commands import set_handler
from services.manage.database import connect
from shared.config import Settings
from shared.db import allocations, placement_audit
from shared.db.placement_audit import Claim, Verdict

CLEAN, FOUND = 0, 1


def _claim(claim: Claim) -> str:
    a = claim.allocation
    where = f"host {claim.host}, node {claim.node}" if claim.host else "a node that is gone"
    return (
        f"  claim {claim.id}: consumer {a.consumer_uuid} (server {a.instance_uuid}) on "
        f"compute node {a.compute_node_id} ({where}): {a.vcpus} vCPUs, {a.memory_mb} MB, "
        f"{a.local_gb} GB; {claim.reason}"
    )


async def audit(args: argparse.Namespace, settings: Settings) -> int:
    async with connect(settings.database_url) as conn:
        found = await placement_audit.unjustified(conn)
        leaks = [c for c in found if c.verdict is Verdict.LEAK]
        held = [c for c in found if c.verdict is Verdict.HELD]
        removed: list[Claim] = []
        if args.delete:
            for claim in leaks:
                if await placement_audit.release_leak(conn, claim) is not None:
                    removed.append(claim)
        lacking = await placement_audit.missing(conn)
        drift = await allocations.usage_drift(conn)
    left = [c for c in leaks if c not in removed]
    print(f"{len(leaks)} claim(s) no live server or move justifies" + (":" if leaks else "."))
    for claim in leaks:
        print(_claim(claim) + (" — removed" if claim in removed else ""))
    if args.delete and left:
        print(f"{len(left)} of them are justified again or gone; left as they are")
    if held:
        print(f"{len(held)} claim(s) held for an operator (resolve the server first):")
        for claim in held:
            print(_claim(claim))
    print(f"{len(lacking)} server(s) or move(s) missing their claims" + (":" if lacking else "."))
    for gap in lacking:
        move = f" (move {gap.migration_uuid})" if gap.migration_uuid else ""
        print(
            f"  server {gap.instance_uuid}{move} on compute node {gap.node_id} (host "
            f"{gap.host}, node {gap.node}): {gap.reason}"
        )
    if drift:
        print(f"{len(drift)} node(s) whose usage is not the sum of their claims:")
        for node in drift:
            print(
                f"  compute node {node.node_id}: {node.vcpus_used}/{node.vcpus_allocated} vCPUs, "
                f"{node.memory_mb_used}/{node.memory_mb_allocated} MB, "
                f"{node.local_gb_used}/{node.local_gb_allocated} GB (recorded/claimed)"
            )
    remaining = (left if args.delete else leaks) + held
    return FOUND if remaining or lacking or drift else CLEAN


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    placement = commands.add_parser("placement", help="resource claims")
    actions = placement.add_subparsers(dest="action", required=True, metavar="ACTION")
    auditing = actions.add_parser(
        "audit",
        help="claims no server or move justifies; servers and moves missing theirs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    auditing.add_argument(
        "--delete",
        action="store_true",
        help="remove the claims no live server or move justifies (each logged)",
    )
    set_handler(auditing, audit)
