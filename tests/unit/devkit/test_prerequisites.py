"""What ``make test`` and ``make run`` say when a server or plugin they need is missing."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from devkit import ROOT, prerequisites
from devkit.environment import clean_environ, with_devkit
from devkit.readiness import free_port
from shared.config import Settings


def closed(scheme: str, port: int | None = None) -> str:
    """A URL of ``scheme`` on a local port nothing listens on."""
    return f"{scheme}://guest:guest@127.0.0.1:{port or free_port()}/postgres"


def test_a_closed_postgresql_port_is_one_line_with_the_command_that_starts_it() -> None:
    port = free_port()
    found = prerequisites.postgres(closed("postgresql", port), "KEEL_TEST_PG")
    assert found is not None
    line = found.line()
    assert "\n" not in line
    assert line.startswith(f"PostgreSQL is not reachable at 127.0.0.1:{port} (")
    assert "pg_ctlcluster --skip-systemctl-redirect" in line
    assert "docker compose up -d postgres" in line
    assert "KEEL_TEST_PG" in line


def test_a_closed_broker_port_is_one_line_and_hides_the_management_check() -> None:
    missing = prerequisites.for_tests(pg_server=closed("postgresql"), amqp_url=closed("amqp"))
    assert [m.what for m in missing] == ["PostgreSQL", "RabbitMQ"]
    assert "rabbitmq-server -detached" in missing[1].line()
    assert "KEEL_TEST_AMQP" in missing[1].line()


def test_a_closed_management_port_names_the_plugin_to_enable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setenv("KEEL_RPC__MANAGEMENT_URL", f"http://127.0.0.1:{port}")
    found = prerequisites.management_api("amqp://guest:guest@127.0.0.1:5672/")
    assert found is not None
    assert found.line().startswith(
        f"the RabbitMQ management API is not reachable at 127.0.0.1:{port}"
    )
    assert "rabbitmq-plugins enable rabbitmq_management" in found.line()


def test_a_cluster_is_reachable_when_one_of_its_nodes_answers() -> None:
    dead, alive = free_port(), free_port()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", alive))
        listening.listen()
        url = f"amqp://u:p@127.0.0.1:{dead},127.0.0.1:{alive}/"
        assert prerequisites.rabbitmq(url, "KEEL_TRANSPORT_URL") is None
    found = prerequisites.postgres(
        f"postgresql://u@127.0.0.1:{dead},127.0.0.1:{alive}/keel?target_session_attrs=read-write",
        "KEEL_DATABASE_URL",
    )
    assert found is not None
    assert found.where == f"127.0.0.1:{dead},127.0.0.1:{alive}"


def test_the_cloud_checks_the_servers_of_its_own_settings() -> None:
    settings = Settings(database_url=closed("postgresql"), transport_url=closed("amqp"))
    assert [(m.what, m.fix.rpartition("point ")[2]) for m in prerequisites.for_cloud(settings)] == [
        ("PostgreSQL", "KEEL_DATABASE_URL at a running server"),
        ("RabbitMQ", "KEEL_TRANSPORT_URL at a running broker"),
    ]


def test_the_command_make_test_runs_prints_one_line_per_missing_server_and_fails() -> None:
    env = with_devkit(clean_environ())
    env.update(KEEL_TEST_PG=closed("postgresql"), KEEL_TEST_AMQP=closed("amqp"))
    result = subprocess.run(
        [sys.executable, "-m", "devkit.prerequisites"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("keel: PostgreSQL is not reachable")
    assert lines[1].startswith("keel: RabbitMQ is not reachable")
    assert result.stdout == ""
