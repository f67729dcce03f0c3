"""Which database errors are worth trying again.

A *transient* error is one a later attempt may not meet: the server is unreachable,
restarting or out of connection slots, the connection broke mid-query, or PostgreSQL
aborted a transaction to resolve a serialization conflict or a deadlock. Everything else
(a constraint violation, a bad query) would fail the same way again.
"""

from __future__ import annotations

import asyncpg

_TRANSIENT: tuple[type[BaseException], ...] = (
    # SQLSTATE class 08: the connection failed or was lost.
    asyncpg.PostgresConnectionError,
    # The server is shutting down, crashed, or is still starting (57P01 to 57P03).
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    # Serialization failures and deadlocks (class 40): the transaction may simply be rerun.
    asyncpg.TransactionRollbackError,
    # Client side: a connection that was closed under us, or a pool shutting down.
    asyncpg.InterfaceError,
    # No route to the server, refused or reset connections.
    OSError,
)


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` is a database failure that a later attempt may not meet."""
    return isinstance(exc, _TRANSIENT)
