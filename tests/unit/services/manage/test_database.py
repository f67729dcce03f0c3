"""URL handling of keel-manage: which database, which server, and no passwords in messages."""

from __future__ import annotations

import pytest

from services.manage.database import database_name, redact, server_of, with_database
from shared.exceptions import KeelError


def test_database_name_is_the_path_of_the_url() -> None:
    assert database_name("postgresql://u:p@db.example:6432/keel_prod?sslmode=require") == (
        "keel_prod"
    )


def test_a_url_without_a_database_is_refused_with_a_fix() -> None:
    with pytest.raises(KeelError, match="names no database"):
        database_name("postgresql://postgres@127.0.0.1:5432")


def test_maintenance_url_keeps_server_credentials_and_options() -> None:
    url = "postgresql://keel:s3cret@db:6432/keel?sslmode=require"
    assert with_database(url, "postgres") == (
        "postgresql://keel:s3cret@db:6432/postgres?sslmode=require"
    )


def test_redact_hides_the_password_only() -> None:
    assert redact("postgresql://keel:s3cret@db:5432/keel") == "postgresql://keel:***@db:5432/keel"
    assert redact("postgresql://keel@db/keel") == "postgresql://keel@db/keel"


def test_server_of_defaults_host_and_port() -> None:
    assert server_of("postgresql://keel@db.example/keel") == "db.example:5432"
    assert server_of("postgresql:///keel") == "localhost:5432"


def test_server_of_a_primary_and_its_standbys_names_each() -> None:
    url = "postgresql://keel:pw@db1:5432,db2:5433/keel?target_session_attrs=read-write"
    assert server_of(url) == "db1:5432,db2:5433"
    assert redact(url) == (
        "postgresql://keel:***@db1:5432,db2:5433/keel?target_session_attrs=read-write"
    )
    assert with_database(url, "postgres") == (
        "postgresql://keel:pw@db1:5432,db2:5433/postgres?target_session_attrs=read-write"
    )
