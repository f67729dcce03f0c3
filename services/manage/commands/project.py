"""``keel-manage project``: the projects users work in and servers belong to."""

from __future__ import annotations

import argparse

from services.manage.commands import set_handler
from services.manage.commands.service import table
from services.manage.commands.user import name_argument
from services.manage.database import connect
from shared.config import Settings
from shared.db import projects, role_assignments

COLUMNS = ("ID", "Name", "Users", "Description")


async def create(args: argparse.Namespace, settings: Settings) -> int:
    """Create a project and print its id; a name already in use is an error."""
    async with connect(settings.database_url) as conn:
        project = await projects.create(conn, args.name, args.description)
    print(project.id)
    return 0


async def list_(args: argparse.Namespace, settings: Settings) -> int:
    async with connect(settings.database_url) as conn:
        found = await projects.list_projects(conn)
        held = await role_assignments.list_assignments(conn)
    if not found:
        print("no projects yet: create one with 'keel-manage project create NAME'")
        return 0
    counts = {p.id: len({a.user_id for a in held if a.project_id == p.id}) for p in found}
    rows = [(p.id, p.name, str(counts[p.id]), p.description) for p in found]
    print(table(COLUMNS, rows))
    return 0


async def delete(args: argparse.Namespace, settings: Settings) -> int:
    """Delete a project that has no servers left; its role assignments go with it."""
    async with connect(settings.database_url) as conn:
        project = await projects.find(conn, args.project)
        await projects.delete(conn, project)
    print(f"deleted project {project.name} ({project.id})")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    project = commands.add_parser("project", help="projects (tenants)")
    actions = project.add_subparsers(dest="action", required=True, metavar="ACTION")
    new = actions.add_parser("create", help="create a project and print its id")
    new.add_argument("name", metavar="NAME", type=name_argument)
    new.add_argument("--description", default="", help="free text shown by 'project list'")
    set_handler(new, create)
    set_handler(actions.add_parser("list", help="list projects"), list_)
    gone = actions.add_parser(
        "delete",
        help="delete a project",
        description="Delete a project. It must have no servers left: delete them first. "
        "Its role assignments, the tokens scoped to it and its quota settings go with it.",
    )
    gone.add_argument("project", metavar="PROJECT", help="the project's name or id")
    set_handler(gone, delete)
