"""Reaching the database named in ``KEEL_DATABASE_URL``, and creating it when asked.

Every failure to connect becomes one :class:`~shared.exceptions.KeelError` whose message
says which server was tried, what went wrong and how to fix it; passwords never appear
in it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import unquote, urlsplit, urlunsplit

import asyncpg

from shared.exceptions import KeelError

LOG = logging.getLogger(__name__)

#: The database every PostgreSQL server has, used to create the one keel needs.
MAINTENANCE_DB = "postgres"
#: Seconds to wait for the server before saying it is unreachable.
CONNECT_TIMEOUT = 10.0

_START_HINT = (
    "start PostgreSQL (e.g. 'pg_ctlcluster 15 main start' or "
    "'docker compose up -d postgres') or point KEEL_DATABASE_URL at a running server"
)


def database_name(url: str) -> str:
    """The database a ``postgresql://`` URL names; an error if it names none."""
    name = unquote(urlsplit(url).path.lstrip("/"))
    if not name:
        raise KeelError(
            f"KEEL_DATABASE_URL {redact(url)} names no database: add one, e.g. '.../keel'"
        )
    return name


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` on the same server, with the same options."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def redact(url: str) -> str:
    """``url`` without its password, fit for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


def server_of(url: str) -> str:
    """``host:port`` of the server a URL points at (each of them, for a URL naming a
    primary and its standbys), for messages."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    if "," in hosts:
        return hosts
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}"


async def _connect(url: str) -> asyncpg.Connection:
    try:
        conn: asyncpg.Connection = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT)
    except asyncpg.InvalidCatalogNameError:
        raise
    except (
        OSError,
        TimeoutError,
        asyncpg.CannotConnectNowError,
        asyncpg.TargetServerAttributeNotMatched,
    ) as exc:
        raise KeelError(
            f"cannot reach PostgreSQL at {server_of(url)} ({_reason(exc)}): {_START_HINT}"
        ) from None
    except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError) as exc:
        raise KeelError(
            f"PostgreSQL at {server_of(url)} refused the login in {redact(url)} ({exc}): "
            "fix the user or password in KEEL_DATABASE_URL, or allow it in pg_hba.conf"
        ) from None
    except asyncpg.PostgresError as exc:
        raise KeelError(f"PostgreSQL at {server_of(url)} refused the connection: {exc}") from None
    for kind in ("json", "jsonb"):
        await conn.set_type_codec(kind, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return conn


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT:.0f}s"
    return str(exc) or type(exc).__name__


@asynccontextmanager
async def connect(url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to an existing database; a missing one says to run ``db sync``."""
    try:
        conn = await _connect(url)
    except asyncpg.InvalidCatalogNameError:
        raise KeelError(
            f"database {database_name(url)!r} does not exist on {server_of(url)}: "
            "run 'keel-manage db sync' to create it"
        ) from None
    try:
        yield conn
    finally:
        await conn.close()


async def ensure_database(url: str) -> bool:
    """Create the database ``url`` names unless it exists; True if it was created."""
    name = database_name(url)
    try:
        conn = await _connect(url)
    except asyncpg.InvalidCatalogNameError:
        pass
    else:
        await conn.close()
        return False
    try:
        admin = await _connect(with_database(url, MAINTENANCE_DB))
    except asyncpg.InvalidCatalogNameError:
        raise KeelError(
            f"database {name!r} does not exist on {server_of(url)} and there is no "
            f"{MAINTENANCE_DB!r} database to create it from: create it by hand"
        ) from None
    try:
        quoted = '"' + name.replace('"', '""') + '"'
        await admin.execute(f"CREATE DATABASE {quoted}")
    except asyncpg.DuplicateDatabaseError:
        LOG.info("database %s was created by someone else meanwhile", name)
        return False
    except asyncpg.InsufficientPrivilegeError:
        raise KeelError(
            f"the user in KEEL_DATABASE_URL may not create database {name!r} on "
            f"{server_of(url)}: create it as a superuser, or grant CREATEDB"
        ) from None
    finally:
        await admin.close()
    LOG.info("created database %s on %s", name, server_of(url))
    return True


async def drop_database(url: str) -> bool:
    """Drop the database ``url`` names; False if there was none.

    Refused (a :class:`KeelError`) while anything else is connected to it.
    """
    name = database_name(url)
    admin = await _connect(with_database(url, MAINTENANCE_DB))
    try:
        if not await admin.fetchval("SELECT true FROM pg_database WHERE datname = $1", name):
            return False
        quoted = '"' + name.replace('"', '""') + '"'
        await admin.execute(f"DROP DATABASE {quoted}")
    except asyncpg.ObjectInUseError:
        raise KeelError(
            f"database {name!r} on {server_of(url)} is in use by another process (a keel cloud "
            "of another checkout?); stop it first"
        ) from None
    except asyncpg.InsufficientPrivilegeError:
        raise KeelError(
            f"the user in KEEL_DATABASE_URL may not drop database {name!r} on "
            f"{server_of(url)}: drop it as its owner or a superuser"
        ) from None
    finally:
        await admin.close()
    return True
