"""``keel-manage user``: who may get a token from the identity API, and in which project.

The same queries as the identity API's ``/v3/users`` (:mod:`shared.db.users`): a user
made here is one the API shows, and the other way round.

A password is given with ``--password`` or, without it, as one line on standard input
(prompted for without echo when standard input is a terminal). It is stored only as a
slow salted hash, and never printed or logged.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from services.manage.commands import UsageError, set_handler
from services.manage.commands.service import table
from services.manage.database import connect
from shared.config import Settings
from shared.db import projects, role_assignments, users
from shared.objects.identity import MEMBER_ROLE
from shared.passwords import check_acceptable, hash_password

COLUMNS = ("ID", "Name", "Project", "Roles")
MAX_NAME = 255


def name_argument(value: str) -> str:
    """A user or project name: 1-255 printable characters, no outer whitespace."""
    if not value or len(value) > MAX_NAME:
        raise argparse.ArgumentTypeError(f"a name has 1 to {MAX_NAME} characters: {value!r}")
    if value != value.strip() or not value.isprintable():
        raise argparse.ArgumentTypeError(
            f"a name has no control characters and no leading or trailing spaces: {value!r}"
        )
    return value


def read_password(given: str | None) -> str:
    """The password from ``--password``, else one line of standard input."""
    if given is None:
        if sys.stdin.isatty():
            given = getpass.getpass("Password: ")
        else:
            given = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    try:
        check_acceptable(given)
    except ValueError as exc:
        raise UsageError(
            f"{exc}: give it with --password or as one line on standard input"
        ) from None
    return given


async def create(args: argparse.Namespace, settings: Settings) -> int:
    """Create a user with a role in a project (their default project); print the user's id."""
    password = read_password(args.password)
    async with connect(settings.database_url) as conn:
        project = await projects.find(conn, args.project)
        user = await users.create_in_project(
            conn, args.name, hash_password(password), project, args.role
        )
    print(user.id)
    return 0


async def set_password(args: argparse.Namespace, settings: Settings) -> int:
    """Give a user a new password; the tokens issued to them stop working."""
    password = read_password(args.password)
    async with connect(settings.database_url) as conn:
        user = await users.find(conn, args.user)
        await users.set_password(conn, user, hash_password(password))
    print(f"changed the password of user {user.name} ({user.id})")
    return 0


async def list_(args: argparse.Namespace, settings: Settings) -> int:
    async with connect(settings.database_url) as conn:
        project_id = (await projects.find(conn, args.project)).id if args.project else None
        found = await role_assignments.list_assignments(conn, project_id=project_id)
    if not found:
        print("no users yet: create one with 'keel-manage user create NAME --project PROJECT'")
        return 0
    held: dict[tuple[str, str, str], list[str]] = {}
    for a in found:
        held.setdefault((a.user_id, a.user_name, a.project_name), []).append(a.role_name)
    rows = [(*key, ", ".join(names)) for key, names in held.items()]
    print(table(COLUMNS, rows))
    return 0


async def delete(args: argparse.Namespace, settings: Settings) -> int:
    """Delete a user; their roles and tokens go with them, their servers stay."""
    async with connect(settings.database_url) as conn:
        user = await users.find(conn, args.user)
        await users.delete(conn, user)
    print(f"deleted user {user.name} ({user.id})")
    return 0


def _password_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--password",
        help="the password (default: read one line from standard input, which keeps it "
        "out of the shell history and the process list)",
    )


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    user = commands.add_parser("user", help="users and their roles")
    actions = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    new = actions.add_parser("create", help="create a user in a project and print its id")
    new.add_argument("name", metavar="NAME", type=name_argument)
    new.add_argument("--project", required=True, help="the project's name or id")
    new.add_argument(
        "--role",
        default=MEMBER_ROLE,
        help="the role's name or id: member (default), admin (every admin route of the API), "
        "reader, manager or any role created through the identity API",
    )
    _password_option(new)
    set_handler(new, create)
    change = actions.add_parser("set-password", help="give a user a new password")
    change.add_argument("user", metavar="USER", help="the user's name or id")
    _password_option(change)
    set_handler(change, set_password)
    listing = actions.add_parser("list", help="list users with their projects and roles")
    listing.add_argument("--project", help="only users of this project (name or id)")
    set_handler(listing, list_)
    gone = actions.add_parser("delete", help="delete a user")
    gone.add_argument("user", metavar="USER", help="the user's name or id")
    set_handler(gone, delete)
