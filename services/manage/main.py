"""``keel-manage``: operator commands against the keel database.

Exit codes: 0 on success, 1 when the command could not do its job (one line on standard
error saying why and what to do), 2 for bad arguments or a bad setting.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from services.manage.commands import (
    HANDLER,
    Command,
    UsageError,
    agent,
    compute,
    db,
    dlq,
    host,
    image,
    network,
    placement,
    project,
    service,
    status,
    user,
)
from shared.config import Settings, add_config_argument, load_settings
from shared.exceptions import ConfigError, KeelError
from shared.logging import setup_logging

PROG = "keel-manage"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operator commands for keel. Settings come from KEEL_* environment "
        "variables and the optional --config file, as for every keel service.",
    )
    add_config_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (
        db,
        image,
        network,
        service,
        project,
        user,
        dlq,
        status,
        compute,
        host,
        agent,
        placement,
    ):
        module.register(commands)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    try:
        return load_settings(args.config)
    except ConfigError as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None


async def _call(command: Command, args: argparse.Namespace, settings: Settings) -> int:
    return await command(args, settings)


def execute(args: argparse.Namespace, settings: Settings) -> int:
    """Run the command ``args`` selected; expected failures print one line and return 1."""
    command: Command = getattr(args, HANDLER)
    try:
        return asyncio.run(_call(command, args, settings))
    except UsageError as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)
        return 2
    except KeelError as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)
        return 1


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, load settings and run the command; return the exit code."""
    args = build_parser().parse_args(argv)
    return execute(args, _settings(args))


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = _settings(args)
    # Commands print what they did; at the default level, logs would only repeat it.
    level = "WARNING" if settings.log_level == "INFO" else settings.log_level
    setup_logging(PROG, settings.host, level, settings.log_format)
    try:
        sys.exit(execute(args, settings))
    except KeyboardInterrupt:
        sys.exit(130)
