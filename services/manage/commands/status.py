"""``keel-manage status upgrade-check``: is the deployment ready for, or done with, an upgrade?

It reads the ``services`` table (deleted and forced-down services do not count) and
prints the minimum version of each binary, then its findings:

* **failure** (exit 2): services older than this release supports
  (``OLDEST_SUPPORTED_SERVICE_VERSION``): conductor, scheduler and api of this release
  refuse to start beside such compute services;
* **warning** (exit 1): services not yet on this release; their RPC versions are pinned
  down until they are upgraded. Or rows an older release wrote that still lack their id
  links (:mod:`shared.db.backfills`): how many, and the online data migration that
  links them — and the rows no migration can link, listed, for an operator to resolve;
* otherwise success (exit 0).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import asyncpg

from services.manage.commands import set_handler
from services.manage.commands.service import table
from services.manage.database import connect
from shared.config import Settings
from shared.db import backfills, services
from shared.db.pool import Connection
from shared.objects.service import Service
from shared.versions import OLDEST_SUPPORTED_SERVICE_VERSION, SERVICE_VERSION, release_name

SUCCESS, WARNING, FAILURE = 0, 1, 2
COLUMNS = ("Binary", "Minimum version", "Services", "Not on the latest")


def _version(number: int) -> str:
    return f"{number} ({release_name(number)})" if number else "0 (never reported)"


def _hosts(found: list[Service]) -> str:
    return ", ".join(f"{s.binary} on {s.host} (v{s.version})" for s in found)


def assess(found: list[Service]) -> tuple[list[tuple[str, ...]], list[str], int]:
    """The table rows, the findings and the exit code for these services."""
    counted = [s for s in found if not s.forced_down]
    by_binary: dict[str, list[Service]] = defaultdict(list)
    for service in counted:
        by_binary[service.binary].append(service)
    rows: list[tuple[str, ...]] = [
        (
            binary,
            _version(min(s.version for s in members)),
            str(len(members)),
            str(sum(1 for s in members if s.version < SERVICE_VERSION)),
        )
        for binary, members in sorted(by_binary.items())
    ]
    unsupported = [s for s in counted if s.version < OLDEST_SUPPORTED_SERVICE_VERSION]
    behind = [s for s in counted if OLDEST_SUPPORTED_SERVICE_VERSION <= s.version < SERVICE_VERSION]
    findings: list[str] = []
    code = SUCCESS
    if unsupported:
        code = FAILURE
        findings.append(
            f"FAILURE: older than this release supports (v{OLDEST_SUPPORTED_SERVICE_VERSION}): "
            f"{_hosts(unsupported)}. Upgrade them, or delete those that are gone."
        )
    if behind:
        code = max(code, WARNING)
        findings.append(
            f"WARNING: not yet on the latest release ({_version(SERVICE_VERSION)}): "
            f"{_hosts(behind)}. RPC versions stay pinned to what they speak until then."
        )
    if not findings:
        findings.append(f"SUCCESS: every service runs release {_version(SERVICE_VERSION)}.")
    return rows, findings, code


async def unlinked_findings(conn: Connection) -> list[str]:
    """A warning per online data migration with rows still to link, and the rows none
    can link (listed); nothing when every row has its links."""
    findings: list[str] = []
    for backfill in backfills.MIGRATIONS:
        try:
            pending = await backfills.pending(conn, backfill)
            stuck, examples = await backfills.unresolved(conn, backfill)
        except (asyncpg.UndefinedColumnError, asyncpg.UndefinedTableError):
            return [
                "WARNING: the database schema is older than this release: run "
                "`keel-manage db sync`, then `keel-manage db online-data-migrations`."
            ]
        linkable = pending - stuck
        if linkable:
            findings.append(
                f"WARNING: {linkable} row(s) written by an older release lack their link "
                f"{backfill.name}: run `keel-manage db online-data-migrations` (migration "
                f"{backfill.name}) to link them."
            )
        if stuck:
            lines = [
                f"WARNING: {stuck} row(s) lack their link {backfill.name} and the online "
                f"migration {backfill.name} cannot link them: nothing matches their names, "
                "and keel never links by guess. Resolve them (see docs/upgrades.md, "
                '"Upgrading: online data migrations"):',
                *(f"  {example}" for example in examples),
            ]
            if stuck > len(examples):
                lines.append(f"  ... and {stuck - len(examples)} more")
            findings.append("\n".join(lines))
    return findings


async def upgrade_check(args: argparse.Namespace, settings: Settings) -> int:
    async with connect(settings.database_url) as conn:
        found = await services.list_services(conn, settings.service_down_time, include_api=True)
        unlinked = await unlinked_findings(conn)
    rows, findings, code = assess(found)
    if unlinked:
        code = max(code, WARNING)
        findings = [f for f in findings if not f.startswith("SUCCESS")] + unlinked
    if rows:
        print(table(COLUMNS, rows))
    else:
        print("no services have registered yet")
    for finding in findings:
        print(finding)
    return code


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser("status", help="checks of the deployment's state")
    checks = status.add_subparsers(dest="check", required=True, metavar="CHECK")
    upgrade = checks.add_parser(
        "upgrade-check",
        help="minimum service versions; services too old or not yet upgraded; unlinked rows",
        description="Exit 0 when every service runs this release and every row has its "
        "id links, 1 when some services are older but supported or rows written by an "
        "older release lack their links (the online data migration that links them is "
        "named; rows none can link are listed), 2 when some services are older than this "
        "release supports.",
    )
    set_handler(upgrade, upgrade_check)
