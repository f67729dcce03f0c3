"""The schema migrations shipped with keel: each version once, each file named as sync reads it."""

from __future__ import annotations

from collections import Counter
from importlib import resources

from shared.db.schema import available


def test_no_two_migrations_share_a_version() -> None:
    counts = Counter(migration.version for migration in available())
    shared = {version: n for version, n in counts.items() if n > 1}
    assert not shared, f"schema migration versions used more than once: {shared}"


def test_every_sql_file_is_a_migration_sync_applies() -> None:
    files = {
        entry.name
        for entry in resources.files("shared.db.schema_sql").iterdir()
        if entry.name.endswith(".sql")
    }
    named = {f"{m.version:04d}_{m.name}.sql" for m in available()}
    assert files == named
