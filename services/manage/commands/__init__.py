"""The subcommands of ``keel-manage``: each module registers its own parsers.

A command is an ``async`` function that receives the parsed arguments and the settings,
prints what it did on standard output, and returns the process exit code. Expected
failures are raised as :class:`~shared.exceptions.KeelError` and printed as one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

from shared.config import Settings
from shared.exceptions import KeelError

Command = Callable[[argparse.Namespace, Settings], Awaitable[int]]

#: The argument name under which each subparser stores its command function.
HANDLER = "handler"


def set_handler(parser: argparse.ArgumentParser, command: Command) -> None:
    parser.set_defaults(**{HANDLER: command})


class UsageError(KeelError):
    """The command was given an unusable value: exit code 2, like a bad argument."""
