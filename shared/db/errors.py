"""Which database errors are worth trying again: one classification for every caller.

Two kinds of failure go away on their own:

* **the database cannot be reached** (:func:`is_unavailable`): the connection was
  refused, lost in the middle of a query or closed under us, the server is starting,
  shutting down or out of connection slots, a connection or query timed out, or — with
  several servers in ``KEEL_DATABASE_URL`` and ``target_session_attrs=read-write`` —
  none of them is a primary yet (a standby is being promoted). The next attempt gets a
  fresh connection from the pool; it succeeds once PostgreSQL (or its new primary) is
  back.
* **a transaction lost a race** (:func:`is_conflict`): a serialization failure or a
  deadlock. PostgreSQL rolled the transaction back; running the whole transaction again
  at once usually succeeds.

:func:`is_transient` is either. Everything else (a constraint violation, bad SQL, bad
data) is a real error: retrying it would fail the same way.
"""

from __future__ import annotations

import errno
import socket

import asyncpg

#: Errors after which the same work may succeed once the database is reachable again.
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,  # refused, reset, aborted, broken pipe
    TimeoutError,  # acquiring a connection, connecting, or a query took too long
    socket.gaierror,  # the server's name does not resolve (yet)
    asyncpg.PostgresConnectionError,  # 08xxx: the connection failed or does not exist
    asyncpg.CannotConnectNowError,  # 57P03: the server is starting up or shutting down
    asyncpg.AdminShutdownError,  # 57P01
    asyncpg.CrashShutdownError,  # 57P02
    asyncpg.TooManyConnectionsError,  # 53300
    # None of the servers of a multi-host URL accepts writes (yet): a failover.
    asyncpg.TargetServerAttributeNotMatched,
)
_CONFLICT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.SerializationError,  # 40001
    asyncpg.DeadlockDetectedError,  # 40P01
)
#: What a plain OSError from connecting carries when the network is in the way.
_NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.EHOSTDOWN,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ETIMEDOUT,
        errno.EADDRNOTAVAIL,
        errno.EPIPE,
    }
)
#: How asyncpg says a connection closed under a caller that still held it.
_CLOSED_MESSAGES = ("connection is closed", "connection was closed")
#: How asyncpg says a connection is out of step with its server: an idle pooled
#: connection that received the server's last words (``FATAL: terminating connection``)
#: just before the connection dropped, and was handed out before the drop was noticed.
_DESYNCED_MESSAGE = "cannot switch to state"


def is_unavailable(exc: BaseException) -> bool:
    """True if ``exc`` means the database could not be reached or was lost."""
    if isinstance(exc, asyncpg.ProtocolViolationError):
        return False
    if isinstance(exc, _UNAVAILABLE_ERRORS):
        return True
    if type(exc) is OSError:
        # asyncio reports a failed connect as a plain OSError: with the errno for one
        # address, without one when every address of the host failed.
        return exc.errno is None or exc.errno in _NETWORK_ERRNOS
    if isinstance(exc, asyncpg.InterfaceError):
        text = str(exc)
        return any(message in text for message in _CLOSED_MESSAGES)
    if isinstance(exc, asyncpg.InternalClientError):
        return _DESYNCED_MESSAGE in str(exc)
    return False


def is_conflict(exc: BaseException) -> bool:
    """True if ``exc`` is a serialization failure or deadlock: rerun the transaction."""
    return isinstance(exc, _CONFLICT_ERRORS)


def is_transient(exc: BaseException) -> bool:
    """True if the same work may succeed when tried again (see the module docstring)."""
    return is_unavailable(exc) or is_conflict(exc)


def describe(exc: BaseException) -> str:
    """One line for a log: the error's class and message, never a traceback."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
