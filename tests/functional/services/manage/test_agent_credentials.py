"""``keel-manage agent credentials HOST`` and ``revoke`` against real RabbitMQ and PostgreSQL."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from uuid import UUID

import aio_pika
import asyncpg
import pytest
from aio_pika.exceptions import ProbableAuthenticationError
from yarl import URL

from services.manage.broker_admin import BrokerAdmin
from shared.config import Settings
from shared.db import agent_users as issued
from shared.rpc.agent_users import service_of
from tests.broker import AMQP_URL
from tests.functional.services.manage.test_manage import manage
from tests.functional.services.manage.test_service_rename import add_host

pytestmark = pytest.mark.functional


def transport_url(env_file: Path) -> str:
    key, _, value = env_file.read_text().strip().partition("=")
    assert key == "KEEL_TRANSPORT_URL"
    return value


async def connects(url: str) -> bool:
    try:
        connection = await aio_pika.connect(url, timeout=5)
    except ProbableAuthenticationError:
        return False
    await connection.close()
    return True


async def test_credentials_for_a_new_host_reserve_its_service_uuid(
    database_url: str, db_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    env_file = tmp_path / "agent.env"
    first = manage(database_url, "agent", "credentials", "new-host", "--env-file", str(env_file))
    assert first.returncode == 0, first.stderr
    url = transport_url(env_file)
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert url not in first.stdout
    service_uuid = service_of(URL(url).user)
    assert service_uuid is not None
    assert f"compute service {service_uuid}, not registered yet" in first.stdout
    try:
        assert await connects(url)
        # Again: the same user (the reservation holds), a new password, the old one dead.
        again = manage(database_url, "agent", "credentials", "new-host")
        assert again.returncode == 0, again.stderr
        printed = next(
            line for line in again.stdout.splitlines() if line.startswith("KEEL_TRANSPORT_URL=")
        )
        renewed = printed.partition("=")[2]
        assert URL(renewed).user == URL(url).user
        assert URL(renewed).password != URL(url).password
        assert await connects(renewed)
        assert not await connects(url)
        async with db_pool.acquire() as conn:
            assert await issued.host_of(conn, service_uuid) == "new-host"
    finally:
        revoked = manage(database_url, "agent", "revoke", "new-host")
    assert revoked.returncode == 0, revoked.stderr
    assert not await connects(renewed)
    async with db_pool.acquire() as conn:
        assert await issued.host_of(conn, service_uuid) is None


async def test_credentials_for_a_registered_host_name_its_service(
    database_url: str, db_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    async with db_pool.acquire() as conn:
        service_uuid, _ = await add_host(conn, "old-host", up=False)
    env_file = tmp_path / "agent.env"
    made = manage(database_url, "agent", "credentials", "old-host", "--env-file", str(env_file))
    assert made.returncode == 0, made.stderr
    try:
        assert service_of(URL(transport_url(env_file)).user) == service_uuid
        assert f"compute service {service_uuid}, registered" in made.stdout
        # A rename keeps the service, so the credentials are revoked by its new name.
        renamed = manage(database_url, "service", "rename", "old-host", "new-name")
        assert renamed.returncode == 0, renamed.stderr
        assert manage(database_url, "agent", "revoke", "old-host").returncode == 1
    finally:
        revoked = manage(database_url, "agent", "revoke", "new-name")
    assert revoked.returncode == 0, revoked.stderr
    assert not await connects(transport_url(env_file))


async def test_concurrent_credentials_for_one_host_reserve_one_uuid(
    db_pool: asyncpg.Pool,
) -> None:
    async def issue() -> UUID:
        async with db_pool.acquire() as conn, conn.transaction():
            return await issued.issue(conn, "raced-host")

    made = await asyncio.gather(*(issue() for _ in range(8)))
    assert len(set(made)) == 1


def test_an_unreachable_management_api_is_one_clear_line(database_url: str) -> None:
    result = manage(
        database_url,
        "agent",
        "credentials",
        "some-host",
        KEEL_RPC__MANAGEMENT_URL="http://127.0.0.1:9",
    )
    assert result.returncode == 1
    assert "cannot reach the RabbitMQ management API at http://127.0.0.1:9" in result.stderr
    assert "Traceback" not in result.stderr
    assert "guest" not in result.stderr


def test_a_blank_host_is_a_usage_error(database_url: str) -> None:
    result = manage(database_url, "agent", "credentials", " padded ")
    assert result.returncode == 2
    assert "HOST must be" in result.stderr


def test_the_management_api_is_found_beside_the_broker() -> None:
    plain = BrokerAdmin.from_settings(
        Settings(transport_url="amqp://keel:s3cret@rabbit.example:5672/prod%2Fkeel")
    )
    assert (plain.base, plain.user, plain.password, plain.vhost) == (
        "http://rabbit.example:15672",
        "keel",
        "s3cret",
        "prod/keel",
    )
    tls = BrokerAdmin.from_settings(Settings(transport_url="amqps://keel:pw@rabbit:5671/"))
    assert (tls.base, tls.vhost) == ("https://rabbit:15671", "/")
    named = BrokerAdmin.from_settings(
        Settings(
            transport_url=AMQP_URL,
            rpc={"management_url": "http://admin:other@mgmt.example:8080/"},  # type: ignore[arg-type]
        )
    )
    assert (named.base, named.user, named.password) == (
        "http://mgmt.example:8080",
        "admin",
        "other",
    )


def test_an_env_file_that_cannot_be_written_changes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    first = tmp_path / "agent.env"
    made = manage(database_url, "agent", "credentials", "env-host", "--env-file", str(first))
    assert made.returncode == 0, made.stderr
    try:
        nowhere = tmp_path / "missing" / "agent.env"
        failed = manage(
            database_url, "agent", "credentials", "env-host", "--env-file", str(nowhere)
        )
        assert failed.returncode == 1
        assert f"cannot write {nowhere}" in failed.stderr
        assert "Traceback" not in failed.stderr
        # The password given before still works: the broker was not asked.
        assert asyncio.run(connects(transport_url(first)))
    finally:
        manage(database_url, "agent", "revoke", "env-host")
    unknown = manage(database_url, "agent", "revoke", "env-host")
    assert unknown.returncode == 1
    assert "no agent credentials were made for host 'env-host'" in unknown.stderr
