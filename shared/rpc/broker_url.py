"""``KEEL_TRANSPORT_URL``: one RabbitMQ node, or every node of a cluster.

A cluster is written as oslo.messaging writes it, the nodes separated by commas in the
URL's network location::

    amqp://keel:secret@rabbit1:5672,rabbit2:5672,rabbit3:5672/keel
    amqps://keel:secret@rabbit1,rabbit2,rabbit3/keel?heartbeat=10

A node may carry its own ``user:password@``; one that does not uses the credentials
written before the first node. The virtual host and the query (``heartbeat``, TLS
options…) are the same for every node. :func:`node_urls` splits such a URL into one
ordinary AMQP URL per node, which is what a client library connects to.
"""

from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit, urlunsplit

SCHEMES = ("amqp", "amqps")
DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}


class BadBrokerUrl(ValueError):
    """The URL does not name a RabbitMQ node (or nodes) keel can connect to."""


def _node(scheme: str, entry: str, credentials: str) -> tuple[str, str]:
    """``(credentials, host:port)`` of one comma-separated entry of the netloc."""
    own, at, address = entry.rpartition("@")
    if at:
        credentials = own
    if not address:
        raise BadBrokerUrl("a node of the URL has no host (two commas in a row?)")
    # urlsplit parses host and port (IPv6 literals in brackets included).
    probe = urlsplit(f"{scheme}://{address}")
    try:
        port = probe.port
    except ValueError:
        raise BadBrokerUrl(f"node {address!r} has an invalid port") from None
    if not probe.hostname:
        raise BadBrokerUrl(f"node {address!r} has no host")
    host = f"[{probe.hostname}]" if ":" in probe.hostname else probe.hostname
    return credentials, f"{host}:{port or DEFAULT_PORTS[scheme]}"


def node_urls(url: str) -> list[str]:
    """One AMQP URL per node of ``url``, in the order written; BadBrokerUrl if malformed."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise BadBrokerUrl("must be an amqp:// or amqps:// URL")
    if not parts.netloc:
        raise BadBrokerUrl("names no broker host")
    first = parts.netloc.partition(",")[0]
    credentials, at, _ = first.rpartition("@")
    shared = credentials if at else ""
    urls: list[str] = []
    for entry in parts.netloc.split(","):
        own, address = _node(parts.scheme, entry, shared)
        netloc = f"{own}@{address}" if own else address
        urls.append(urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")))
    return urls


def without_credentials(url: str) -> str:
    """``url`` with every node's ``user:password@`` left out, for logs and errors."""
    parts = urlsplit(url)
    nodes = ",".join(entry.rpartition("@")[2] for entry in parts.netloc.split(","))
    return urlunsplit((parts.scheme, nodes, parts.path, "", ""))


def node_address(url: str) -> str:
    """``host:port`` of a one-node URL (as :func:`node_urls` returns them)."""
    return urlsplit(url).netloc.rpartition("@")[2]


def user_of(url: str) -> str:
    """The user the first node is connected to as (``guest`` when none is written)."""
    node = node_urls(url)[0]
    user = urlsplit(node).username
    return unquote(user) if user else "guest"


def with_user(url: str, user: str, password: str) -> str:
    """``url`` with every node's credentials replaced by ``user`` and ``password``."""
    parts = urlsplit(url)
    credentials = f"{quote(user, safe='')}:{quote(password, safe='')}"
    nodes = ",".join(entry.rpartition("@")[2] for entry in parts.netloc.split(","))
    return urlunsplit(parts._replace(netloc=f"{credentials}@{nodes}"))
