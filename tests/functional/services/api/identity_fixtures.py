"""Projects and users made directly in the database, for the identity and quota tests."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import httpx

from shared.db import projects, users
from shared.objects.identity import MEMBER_ROLE
from shared.passwords import hash_password


@dataclass(frozen=True)
class Person:
    user_id: str
    name: str
    password: str
    project_id: str
    project: str


async def add_person(
    pool: asyncpg.Pool, name: str, project: str, role: str = MEMBER_ROLE, password: str = ""
) -> Person:
    """A user with ``role`` in ``project`` (created if missing)."""
    password = password or f"{name}-secret"
    async with pool.acquire() as conn:
        found = await projects.list_projects(conn, name=project)
        owner = found[0] if found else await projects.create(conn, project)
        user = await users.create_in_project(conn, name, hash_password(password), owner, role)
    return Person(user.id, name, password, owner.id, owner.name)


def password_body(
    person: Person, *, password: str | None = None, by_id: bool = False
) -> dict[str, object]:
    user: dict[str, object] = (
        {"id": person.user_id} if by_id else {"name": person.name, "domain": {"name": "Default"}}
    )
    user["password"] = person.password if password is None else password
    project = (
        {"id": person.project_id}
        if by_id
        else {"name": person.project, "domain": {"id": "default"}}
    )
    return {
        "auth": {
            "identity": {"methods": ["password"], "password": {"user": user}},
            "scope": {"project": project},
        }
    }


async def token_for(client: httpx.AsyncClient, person: Person) -> str:
    response = await client.post("/identity/v3/auth/tokens", json=password_body(person))
    assert response.status_code == 201, response.text
    return response.headers["X-Subject-Token"]
