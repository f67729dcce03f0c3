"""The servers and plugins ``make run`` and ``make test`` need, checked before anything runs.

Each one missing is one line naming it, where it was looked for, why it did not answer
and the command that fixes it. ``make test`` runs ``python -m devkit.prerequisites``
(the test servers: ``KEEL_TEST_PG``, ``KEEL_TEST_AMQP`` and RabbitMQ's management API,
found as the tests find it: ``KEEL_RPC__MANAGEMENT_URL``, else port 15672 of the broker's
host); ``make run`` checks the servers of ``KEEL_DATABASE_URL`` and ``KEEL_TRANSPORT_URL``.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from devkit.servers import AMQP_URL, PG_SERVER
from services.manage.broker_admin import BrokerAdmin
from shared.config import Settings

#: Seconds a server has to accept a TCP connection.
CONNECT_TIMEOUT = 3.0


@dataclass(frozen=True)
class Missing:
    """A server or plugin that did not answer."""

    what: str
    where: str
    reason: str
    fix: str

    def line(self) -> str:
        return f"{self.what} is not reachable at {self.where} ({self.reason}): {self.fix}"


def addresses(url: str, default_port: int) -> list[tuple[str, int]]:
    """Every ``(host, port)`` ``url`` names: one, or each node of a cluster's URL
    (``amqp://u:p@h1:5672,h2:5672/``, ``postgresql://u@db1,db2/keel``)."""
    found = []
    for entry in urlsplit(url).netloc.rpartition("@")[2].split(","):
        node = urlsplit(f"//{entry.rpartition('@')[2]}")
        found.append((node.hostname or "localhost", node.port or default_port))
    return found


def unreachable(url: str, default_port: int) -> tuple[str, str | None]:
    """``host:port`` of ``url`` (comma-separated for several) and why a TCP connection
    failed to every one of them (None: one answered)."""
    nodes = addresses(url, default_port)
    where = ",".join(f"{host}:{port}" for host, port in nodes)
    reason = ""
    for host, port in nodes:
        try:
            with socket.create_connection((host, port), CONNECT_TIMEOUT):
                return where, None
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
    return where, reason


def _postgres_version() -> str:
    clusters = sorted(p.name for p in Path("/etc/postgresql").glob("*") if p.is_dir())
    return clusters[-1] if clusters else "<version>"


def postgres(url: str, variable: str) -> Missing | None:
    """PostgreSQL at ``url`` (the setting ``variable`` names it)."""
    where, error = unreachable(url, 5432)
    if error is None:
        return None
    return Missing(
        "PostgreSQL",
        where,
        error,
        f"start it with 'pg_ctlcluster --skip-systemctl-redirect {_postgres_version()} main "
        "start' (as root) or 'docker compose up -d postgres', "
        f"or point {variable} at a running server",
    )


def rabbitmq(url: str, variable: str) -> Missing | None:
    """RabbitMQ at ``url`` (the setting ``variable`` names it)."""
    where, error = unreachable(url, 5672)
    if error is None:
        return None
    return Missing(
        "RabbitMQ",
        where,
        error,
        "start it with 'rabbitmq-server -detached' (as root) or "
        f"'docker compose up -d rabbitmq', or point {variable} at a running broker",
    )


def management_api(transport_url: str) -> Missing | None:
    """RabbitMQ's management API, found as ``keel-manage agent`` finds it."""
    base = BrokerAdmin.from_settings(Settings(transport_url=transport_url)).base
    where, error = unreachable(base, 15672)
    if error is None:
        return None
    return Missing(
        "the RabbitMQ management API",
        where,
        error,
        "enable its plugin with 'rabbitmq-plugins enable rabbitmq_management' (as root), "
        "or point KEEL_RPC__MANAGEMENT_URL at it",
    )


def for_tests(pg_server: str = PG_SERVER, amqp_url: str = AMQP_URL) -> list[Missing]:
    """What the functional and end-to-end tests need that does not answer."""
    missing = [postgres(pg_server, "KEEL_TEST_PG")]
    broker = rabbitmq(amqp_url, "KEEL_TEST_AMQP")
    missing.append(broker if broker is not None else management_api(amqp_url))
    return [m for m in missing if m is not None]


def for_cloud(settings: Settings) -> list[Missing]:
    """What a local cloud (``make run``) needs that does not answer."""
    missing = [
        postgres(settings.database_url, "KEEL_DATABASE_URL"),
        rabbitmq(settings.transport_url, "KEEL_TRANSPORT_URL"),
    ]
    return [m for m in missing if m is not None]


def main() -> int:
    """Print one line per missing prerequisite of the tests; 1 if any is missing."""
    missing = for_tests()
    for found in missing:
        print(f"keel: {found.line()}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
