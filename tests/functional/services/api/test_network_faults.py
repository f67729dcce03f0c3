"""Networking API writes whose database call fails once, over real PostgreSQL.

Each write (networks, subnets and security groups: create, rename, delete) runs with
each of its database calls failing in turn (before the statement or the commit reached
PostgreSQL, or after the commit took effect with its answer lost). The client is
answered 503, or (past the last call) the write's own answer; what it wrote is whole or
absent, never half there; and the same request sent again succeeds or is refused
cleanly (a 4xx saying the first one took effect), leaving the write whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import MEMBER, Faulty, Look, Send, every_fault
from tests.functional.services.api.test_project_networks import new_network

pytestmark = pytest.mark.functional

BASE = "/network/v2.0"


async def network_state(pool: asyncpg.Pool, name: str) -> set[tuple[Any, ...]]:
    """The networks named ``name``, or with the id ``name``: each one's name, project,
    subnet and pool size (a set: a create answered 503 after it took effect and sent
    again makes a second just like it)."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT n.name, n.project_id, n.subnet_id, n.subnet_name, n.cidr::text,
                      host(n.gateway_ip), host(n.first_address), host(n.last_address),
                      (SELECT count(*) FROM fixed_ips f WHERE f.network_id = n.id)
                 FROM networks n WHERE n.name = $1 OR n.id::text = $1""",
            name,
        )
    return {tuple(row.values()) for row in rows}


async def group_state(pool: asyncpg.Pool, name: str) -> set[tuple[Any, ...]]:
    """The security groups named ``name``, or with the id ``name``."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT name, description, project_id FROM security_groups
                WHERE name = $1 OR id::text = $1""",
            name,
        )
    return {tuple(row.values()) for row in rows}


Write = Callable[[str], Awaitable[tuple[Send, Look]]]


def writes(client: httpx.AsyncClient, pool: asyncpg.Pool) -> dict[str, Write]:
    """Each write, as ``write(name)``: it makes what the write needs (through ``client``),
    and answers how to send the write and how to look at what it changes."""

    def networks(key: str) -> Look:
        return lambda: network_state(pool, key)

    def groups(key: str) -> Look:
        return lambda: group_state(pool, key)

    async def network_create(name: str) -> tuple[Send, Look]:
        async def send(c: httpx.AsyncClient) -> httpx.Response:
            return await c.post(
                f"{BASE}/networks", headers=MEMBER, json={"network": {"name": name}}
            )

        return send, networks(name)

    async def subnet_create(name: str) -> tuple[Send, Look]:
        net = await new_network(client, name, None)
        body = {"subnet": {"network_id": net["id"], "cidr": "10.81.0.0/28", "name": "s"}}

        async def send(c: httpx.AsyncClient) -> httpx.Response:
            return await c.post(f"{BASE}/subnets", headers=MEMBER, json=body)

        return send, networks(name)

    async def network_rename(name: str) -> tuple[Send, Look]:
        net = await new_network(client, name, "10.82.0.0/28")

        async def send(c: httpx.AsyncClient) -> httpx.Response:
            body = {"network": {"name": f"{name}-renamed"}}
            return await c.put(f"{BASE}/networks/{net['id']}", headers=MEMBER, json=body)

        return send, networks(net["id"])

    async def subnet_rename(name: str) -> tuple[Send, Look]:
        net = await new_network(client, name, "10.83.0.0/28")

        async def send(c: httpx.AsyncClient) -> httpx.Response:
            body = {"subnet": {"name": "renamed"}}
            subnet = net["subnet"]["id"]
            return await c.put(f"{BASE}/subnets/{subnet}", headers=MEMBER, json=body)

        return send, networks(name)

    async def subnet_delete(name: str) -> tuple[Send, Look]:
        net = await new_network(client, name, "10.84.0.0/28")

        async def send(c: httpx.AsyncClient) -> httpx.Response:
            return await c.delete(f"{BASE}/subnets/{net['subnet']['id']}", headers=MEMBER)

        return send, networks(name)

    async def network_delete(name: str) -> tuple[Send, Look]:
        net = await new_network(client, name, "10.85.0.0/28")

        async def send(c: httpx.AsyncClient) -> httpx.Response:
            return await c.delete(f"{BASE}/networks/{net['id']}", headers=MEMBER)

        return send, networks(name)

    async def group_create(name: str) -> tuple[Send, Look]:
        async def send(c: httpx.AsyncClient) -> httpx.Response:
            body = {"security_group": {"name": name, "description": "web"}}
            return await c.post(f"{BASE}/security-groups", headers=MEMBER, json=body)

        return send, groups(name)

    async def new_group(name: str) -> str:
        body = {"security_group": {"name": name, "description": "web"}}
        made = await client.post(f"{BASE}/security-groups", headers=MEMBER, json=body)
        assert made.status_code == 201, made.text
        group_id: str = made.json()["security_group"]["id"]
        return group_id

    async def group_update(name: str) -> tuple[Send, Look]:
        group_id = await new_group(name)

        async def send(c: httpx.AsyncClient) -> httpx.Response:
            body = {"security_group": {"name": f"{name}-renamed", "description": "db"}}
            return await c.put(f"{BASE}/security-groups/{group_id}", headers=MEMBER, json=body)

        return send, groups(group_id)

    async def group_delete(name: str) -> tuple[Send, Look]:
        group_id = await new_group(name)

        async def send(c: httpx.AsyncClient) -> httpx.Response:
            return await c.delete(f"{BASE}/security-groups/{group_id}", headers=MEMBER)

        return send, groups(group_id)

    return {
        "network-create": network_create,
        "subnet-create": subnet_create,
        "network-rename": network_rename,
        "subnet-rename": subnet_rename,
        "subnet-delete": subnet_delete,
        "network-delete": network_delete,
        "group-create": group_create,
        "group-update": group_update,
        "group-delete": group_delete,
    }


#: Each write's answer, and what the same request sent again may be answered once the
#: first took effect: a second subnet is refused (400), a delete finds nothing (404).
ANSWERS: dict[str, tuple[int, frozenset[int]]] = {
    "network-create": (201, frozenset()),
    "subnet-create": (201, frozenset({400})),
    "network-rename": (200, frozenset()),
    "subnet-rename": (200, frozenset()),
    "subnet-delete": (204, frozenset({404})),
    "network-delete": (204, frozenset({404})),
    "group-create": (201, frozenset()),
    "group-update": (200, frozenset()),
    "group-delete": (204, frozenset({404})),
}


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
@pytest.mark.parametrize("write", list(ANSWERS))
async def test_a_network_write_whose_database_call_fails_once_is_whole_or_absent_and_repeats(
    client: httpx.AsyncClient,
    faulty: Faulty,
    db_pool: asyncpg.Pool,
    write: str,
    answered: bool,
) -> None:
    done, again = ANSWERS[write]
    calls = await every_fault(
        faulty, client, answered, writes(client, db_pool)[write], done=done, again=again
    )
    # Acquire, a statement and the commit; of them, only the commit's answer matters.
    assert calls >= (1 if answered else 3)
