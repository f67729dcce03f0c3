"""Pooled connections go back without a reset query, so no code may leave session state.

:class:`shared.db.pool.KeelConnection` skips asyncpg's reset on release (one round trip
and one transaction fewer per ``acquire()``). That is only right while nothing keel runs
on a pooled connection changes the session: no session-level advisory lock (outside
``db sync``, which releases its own), no ``LISTEN``, no cursor declared outside a
transaction, no ``SET`` beyond ``SET LOCAL``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

SESSION_STATE = re.compile(
    r"pg_advisory_lock(_shared)?\s*\(|set_config\s*\(|add_listener\s*\("
    r"|(?-i:\bLISTEN\s+\w|\bDECLARE\s+\w+\s+CURSOR)"
    # SET of a session setting (an UPDATE's SET names columns, SET LOCAL ends with the
    # transaction).
    r"|\bSET\s+(SESSION\b|ROLE\b|TIME\s+ZONE\b|search_path|statement_timeout|lock_timeout"
    r"|idle_in_transaction_session_timeout|work_mem|application_name|synchronous_commit"
    r"|default_transaction_\w+)",
    re.IGNORECASE,
)
#: Where session state is set on purpose, and released there.
ALLOWED = {"shared/db/schema.py"}


def test_no_code_leaves_session_state_on_a_pooled_connection() -> None:
    found = []
    for path in sorted((ROOT / "shared").rglob("*.py")) + sorted((ROOT / "services").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SESSION_STATE.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == [], "session state on a pooled connection:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_must() -> None:
    for text in (
        "SELECT pg_advisory_lock($1)",
        "LISTEN instances",
        "DECLARE c CURSOR FOR SELECT 1",
        "SET statement_timeout = 0",
        "SET SESSION work_mem TO '1MB'",
        "SELECT set_config('x', 'y', false)",
    ):
        assert SESSION_STATE.search(text), text
    for text in (
        "SELECT pg_advisory_xact_lock($1)",
        "SET LOCAL lock_timeout = '1s'",
        "UPDATE instances SET vm_state = $2",
        "ON CONFLICT (uuid) DO UPDATE SET host = EXCLUDED.host",
    ):
        assert not SESSION_STATE.search(text), text
