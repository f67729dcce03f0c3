"""Which database errors are transient: one classification for every caller."""

from __future__ import annotations

import errno
import socket

import asyncpg
import pytest

from shared.db.errors import describe, is_conflict, is_transient, is_unavailable


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"),
        ConnectionResetError(),
        TimeoutError(),
        socket.gaierror(-2, "Name or service not known"),
        OSError(errno.EHOSTUNREACH, "Connect call failed"),
        OSError("Multiple exceptions: [Errno 111] ..., [Errno 99] ..."),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.InterfaceError("cannot perform operation: connection is closed"),
        asyncpg.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"
        ),
        asyncpg.TargetServerAttributeNotMatched(
            "None of the hosts match the target attribute requirement read-write"
        ),
    ],
)
def test_an_unreachable_database_is_transient(error: BaseException) -> None:
    assert is_unavailable(error)
    assert is_transient(error)
    assert not is_conflict(error)


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.SerializationError("could not serialize access due to concurrent update"),
        asyncpg.DeadlockDetectedError("deadlock detected"),
    ],
)
def test_a_lost_race_is_transient(error: BaseException) -> None:
    assert is_conflict(error)
    assert is_transient(error)
    assert not is_unavailable(error)


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.UniqueViolationError("duplicate key"),
        asyncpg.DataError("value out of int32 range"),
        asyncpg.UndefinedTableError("relation does not exist"),
        asyncpg.ProtocolViolationError("protocol violation"),
        asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
        asyncpg.InternalClientError("a bug of the driver"),
        FileNotFoundError(errno.ENOENT, "no such file"),
        PermissionError(errno.EACCES, "denied"),
        OSError(errno.ENOSPC, "No space left on device"),
        ValueError("bad"),
        RuntimeError("bug"),
    ],
)
def test_real_errors_are_not_transient(error: BaseException) -> None:
    assert not is_transient(error)


def test_describe_is_one_line() -> None:
    error = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed\nsecond line")
    assert describe(error) == "ConnectionRefusedError: [Errno 111] Connect call failed"
    assert describe(TimeoutError()) == "TimeoutError"
