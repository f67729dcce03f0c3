"""Fixtures shared by every test layer.

Functional and end-to-end tests talk to a real PostgreSQL and RabbitMQ. Each test gets
its own freshly migrated database and its own exchange, so tests never see each
other's rows or messages. Point the suite elsewhere with ``KEEL_TEST_PG`` (a server URL,
any database) and ``KEEL_TEST_AMQP``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from shared.config import DatabaseSettings
from shared.db import schema
from shared.db.pool import create_pool
from tests.broker import AMQP_URL, remove_exchange
from tests.faults.proxy import TcpProxy

PG_SERVER = os.environ.get("KEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@pytest.fixture
def amqp_url() -> str:
    return AMQP_URL


@pytest.fixture
async def exchange() -> AsyncIterator[str]:
    """An exchange (and so a queue prefix) no other test uses; removed afterwards.

    Queues the test declared under it expire on their own (tests set ``queue_expires``).
    """
    name = f"keel-test-{uuid.uuid4().hex[:12]}"
    yield name
    await remove_exchange(name)


@pytest.fixture
async def database_url() -> AsyncIterator[str]:
    """A new, fully migrated database, dropped after the test."""
    name = f"keel_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(PG_SERVER)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = _with_database(PG_SERVER, name)
    conn = await asyncpg.connect(url)
    try:
        await schema.sync(conn)
    finally:
        await conn.close()
    yield url
    admin = await asyncpg.connect(PG_SERVER)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def db_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, DatabaseSettings(connect_timeout=5))
    yield pool
    await pool.close()


@pytest.fixture
async def pg_proxy() -> AsyncIterator[TcpProxy]:
    """A TCP proxy to the test PostgreSQL server that the test can cut and restore."""
    target = urlsplit(PG_SERVER)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    yield proxy
    await proxy.close()


@pytest.fixture
async def amqp_proxy() -> AsyncIterator[TcpProxy]:
    """A TCP proxy to the test RabbitMQ that the test can cut and restore."""
    target = urlsplit(AMQP_URL)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5672)
    await proxy.start()
    yield proxy
    await proxy.close()
