"""``keel-manage agent``: per-agent RabbitMQ users (see :mod:`shared.rpc.agent_users`)."""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path

from services.manage.broker_admin import BrokerAdmin
from services.manage.commands import UsageError, set_handler
from services.manage.database import connect
from shared.config import Settings
from shared.db import agent_users as issued
from shared.exceptions import KeelError
from shared.rpc.agent_users import permissions, user_for
from shared.rpc.broker_url import with_user


def agent_url(transport_url: str, user: str, password: str) -> str:
    """``transport_url`` with the agent's user and password in it (on every node)."""
    return with_user(transport_url, user, password)


def _scratch_file(path: Path, text: str) -> Path:
    """Write ``text`` beside ``path``, readable by its owner only; the file written.

    Written before the broker is asked for the new password, so a path that cannot be
    written is an error while the old password still works.
    """
    scratch = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        raise KeelError(f"cannot write {path}: {exc.strerror}; nothing was changed") from None
    return scratch


async def credentials(args: argparse.Namespace, settings: Settings) -> int:
    """Make (or renew) the broker user of HOST's agent and print its transport URL."""
    host = args.host
    if not 0 < len(host) <= 255 or host != host.strip():
        raise UsageError(f"HOST must be 1 to 255 characters without surrounding spaces: {host!r}")
    admin = BrokerAdmin.from_settings(settings)
    async with connect(settings.database_url) as conn, conn.transaction():
        service_uuid = await issued.issue(conn, host)
        registered = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM services WHERE uuid = $1)", service_uuid
        )
    user = user_for(service_uuid)
    password = secrets.token_urlsafe(32)
    line = f"KEEL_TRANSPORT_URL={agent_url(settings.transport_url, user, password)}\n"
    scratch = None if args.env_file is None else _scratch_file(args.env_file, line)
    try:
        await admin.put_user(user, password, permissions(settings.exchange, service_uuid))
    except BaseException:
        if scratch is not None:
            scratch.unlink(missing_ok=True)
        raise
    state = "registered" if registered else "not registered yet: its first start takes this id"
    print(f"broker user {user} for host {host!r} (compute service {service_uuid}, {state})")
    if scratch is not None:
        os.replace(scratch, args.env_file)
        print(f"wrote its KEEL_TRANSPORT_URL to {args.env_file} (mode 0600)")
    else:
        print("give the agent on that host this setting, and keep it secret:")
        print(line, end="")
    print("any earlier password of this user no longer works")
    return 0


async def revoke(args: argparse.Namespace, settings: Settings) -> int:
    """Remove every broker user made for HOST's agent; its connections are closed."""
    admin = BrokerAdmin.from_settings(settings)
    async with connect(settings.database_url) as conn:
        rows = await conn.fetch(
            """SELECT c.service_uuid, c.broker_user FROM agent_credentials c
                LEFT JOIN services s ON s.uuid = c.service_uuid AND s.deleted_at IS NULL
                WHERE coalesce(s.host, c.host) = $1""",
            args.host,
        )
    if not rows:
        raise KeelError(f"no agent credentials were made for host {args.host!r}")
    for row in rows:
        await admin.delete_user(row["broker_user"])
        async with connect(settings.database_url) as conn:
            await conn.execute(
                "DELETE FROM agent_credentials WHERE service_uuid = $1", row["service_uuid"]
            )
        print(f"removed broker user {row['broker_user']}")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = commands.add_parser("agent", help="per-agent RabbitMQ users")
    actions = agent.add_subparsers(dest="action", required=True, metavar="ACTION")
    making = actions.add_parser(
        "credentials",
        help="make or renew the broker user of a compute host's agent",
        description="Make the RabbitMQ user HOST's keel-compute agent connects as, named "
        "after its compute service UUID (so it stays valid when the host is renamed), "
        "with a new password: it may read only its own queue and publish only to the "
        "conductor, and the conductor answers it only about its own service, nodes, "
        "servers and migrations. Run again to change the password. Needs the RabbitMQ "
        "management API (KEEL_RPC__MANAGEMENT_URL) and an administrator transport user.",
    )
    making.add_argument("host", metavar="HOST", help="the compute host (KEEL_HOST of its agent)")
    making.add_argument(
        "--env-file",
        type=Path,
        metavar="PATH",
        help="write KEEL_TRANSPORT_URL=... to PATH (mode 0600) instead of printing it",
    )
    set_handler(making, credentials)
    revoking = actions.add_parser(
        "revoke",
        help="remove the broker users made for a compute host's agent",
        description="Delete the RabbitMQ users made for HOST's agent; RabbitMQ closes "
        "their connections.",
    )
    revoking.add_argument("host", metavar="HOST", help="the compute host")
    set_handler(revoking, revoke)
