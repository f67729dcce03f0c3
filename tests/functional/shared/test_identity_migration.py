"""Migration 0040 over a database that already has users: each keeps the role it had,
now a row of ``roles``, with what it implies."""

from __future__ import annotations

import pytest

from devkit.database import Scratch
from services.manage.database import connect
from shared.db import roles, schema

pytestmark = pytest.mark.functional

BEFORE = 21  # the last migration before the identity admin API's


async def test_users_keep_their_roles_through_the_migration(databases: Scratch) -> None:
    url = await databases.empty("upgrade")
    async with connect(url) as conn:
        await schema.sync(conn, up_to=BEFORE)
        await conn.execute("INSERT INTO projects (id, name) VALUES ('p', 'web')")
        await conn.execute(
            """INSERT INTO users (id, name, password_hash, default_project_id)
               VALUES ('a', 'alice', 'scrypt$x', 'p'), ('b', 'bob', 'scrypt$y', 'p')"""
        )
        await conn.execute(
            """INSERT INTO role_assignments (user_id, project_id, role)
               VALUES ('a', 'p', 'admin'), ('b', 'p', 'member')"""
        )
        await schema.sync(conn)
        held = {
            user: [r.name for r in await roles.effective(conn, user, "p")] for user in ("a", "b")
        }
        enabled = await conn.fetch(
            "SELECT enabled FROM users UNION ALL SELECT enabled FROM projects"
        )
    databases.drop_soon(url)
    assert held == {"a": ["admin", "manager", "member", "reader"], "b": ["member", "reader"]}
    assert all(row["enabled"] for row in enabled)
