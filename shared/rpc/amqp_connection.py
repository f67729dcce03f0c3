"""One AMQP connection to a RabbitMQ cluster: to whichever node answers, again after a loss.

:meth:`BrokerConnection.open` tries the nodes of ``KEEL_TRANSPORT_URL``
(:mod:`shared.rpc.broker_url`) in turn, starting at a random one so that a deployment's
processes spread over the cluster, and retries with jittered backoff for
``connect_timeout`` seconds. Once a node answers, ``on_connect`` runs on the new
connection (the transport declares its exchanges and its reply queue there and attaches
its consumers); if that fails, the connection is closed and the next node is tried.

When the connection drops — its node killed, restarted, paused by ``pause_minority``,
or the network cut — ``on_lost`` is told at once (the transport fails the calls waiting
for a reply: their exclusive reply queue went with the connection), and the connection
is opened again: the next node first, at once, then each node in turn with jittered
exponential backoff up to :data:`MAX_BACKOFF` seconds, for as long as it takes. Every
failed attempt and every reconnection is logged with the node's address.
:meth:`BrokerConnection.ready` waits, bounded, for a live connection.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

import aio_pika
from aio_pika.abc import AbstractConnection
from aiormq.exceptions import (
    AMQPConnectionError,
    AMQPError,
    AuthenticationError,
    ProbableAuthenticationError,
)

from shared.config import BROKER_ATTEMPT_TIMEOUT, url_heartbeat
from shared.exceptions import MessagingError
from shared.rpc.broker_url import node_address, node_urls, without_credentials

LOG = logging.getLogger(__name__)

#: Seconds one connection attempt (TCP, TLS and the AMQP handshake) may take.
ATTEMPT_TIMEOUT = BROKER_ATTEMPT_TIMEOUT
#: The longest pause between two attempts after a connection was lost.
MAX_BACKOFF = 5.0
#: The first pause; each failed attempt doubles its upper bound.
FIRST_BACKOFF = 0.1

OnConnect = Callable[[AbstractConnection], Awaitable[None]]
OnLost = Callable[[str], None]


def _refused_credentials(exc: BaseException) -> bool:
    return isinstance(exc, AuthenticationError | ProbableAuthenticationError)


def with_heartbeat(url: str, heartbeat: int) -> str:
    """``url`` asking for ``heartbeat`` seconds of AMQP heartbeat, unless it says (or
    ``heartbeat`` is 0: the broker's)."""
    if heartbeat <= 0 or url_heartbeat(url) is not None:
        return url
    return f"{url}{'&' if '?' in url else '?'}heartbeat={heartbeat}"


def backoff(failures: int) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row: full jitter."""
    return random.uniform(0, min(MAX_BACKOFF, FIRST_BACKOFF * 2**failures))


class BrokerConnection:
    """See the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        on_connect: OnConnect,
        on_lost: OnLost,
        retry_first: tuple[type[BaseException], ...] = (),
        heartbeat: int = 0,
    ) -> None:
        self.nodes = [with_heartbeat(node, heartbeat) for node in node_urls(url)]
        #: The cluster's address without credentials, for logs and errors.
        self.where = without_credentials(url)
        self.connect_timeout = connect_timeout
        #: Errors of ``on_connect`` worth waiting out on the first connection.
        self._retry_first = retry_first
        self._on_connect = on_connect
        self._on_lost = on_lost
        self._next = random.randrange(len(self.nodes))
        self._connection: AbstractConnection | None = None
        #: ``host:port`` of the node connected to now.
        self.node: str | None = None
        self._connected = asyncio.Event()
        self._lost = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        #: Connections opened since :meth:`open` (a test can see a reconnection).
        self.connections = 0

    @property
    def is_open(self) -> bool:
        """True once :meth:`open` succeeded and until :meth:`close`."""
        return self._supervisor is not None

    @property
    def connection(self) -> AbstractConnection | None:
        """The live connection, or None while there is none."""
        return self._connection

    async def _attempt(self) -> AbstractConnection:
        """Connect to the next node and run ``on_connect``; raise if either fails."""
        url = self.nodes[self._next]
        self._next = (self._next + 1) % len(self.nodes)
        address = node_address(url)
        connection = await aio_pika.connect(url, timeout=ATTEMPT_TIMEOUT)
        try:
            await self._on_connect(connection)
        except BaseException:
            await connection.close()
            raise
        connection.close_callbacks.add(self._on_close)
        self._connection, self.node = connection, address
        self.connections += 1
        self._connected.set()
        if not connection.connected.is_set():
            # Dropped after on_connect and before the callback was there to hear it.
            self._lose(connection, "connection closed while it was being set up")
        return connection

    async def open(self) -> None:
        """Connect to a node within ``connect_timeout``; MessagingError if none answers."""
        if self._supervisor is not None:
            return
        started = time.monotonic()
        failures = 0
        while True:
            try:
                await self._attempt()
                break
            except Exception as exc:
                if _refused_credentials(exc):
                    raise MessagingError(
                        f"RabbitMQ at {self.where} refused the connection: {exc}; check the "
                        "user, password and vhost in KEEL_TRANSPORT_URL"
                    ) from None
                transient: tuple[type[BaseException], ...] = (
                    AMQPConnectionError,
                    OSError,
                    TimeoutError,
                    *self._retry_first,
                )
                if not isinstance(exc, transient):
                    raise
                left = self.connect_timeout - (time.monotonic() - started)
                if left <= 0:
                    raise MessagingError(
                        f"cannot connect to RabbitMQ at {self.where} within "
                        f"{self.connect_timeout:g}s: {exc}"
                    ) from None
                failures += 1
                pause = min(backoff(failures), left)
                LOG.warning(
                    "RabbitMQ at %s not reachable (attempt %d): %s; retrying in %.1fs, "
                    "giving up in %.0fs",
                    self.where,
                    failures,
                    exc,
                    pause,
                    left,
                )
                await asyncio.sleep(pause)
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        LOG.info("connected to RabbitMQ node %s of %s", self.node, self.where)

    def _on_close(self, sender: object, exc: BaseException | None = None) -> None:
        if isinstance(sender, AbstractConnection):
            self._lose(sender, str(exc) if exc else "closed by the broker")

    def _lose(self, connection: AbstractConnection, reason: str) -> None:
        if self._closing or connection is not self._connection:
            return
        self._connection = None
        self._connected.clear()
        LOG.warning("lost the connection to RabbitMQ node %s: %s", self.node, reason)
        self._on_lost(f"connection to RabbitMQ node {self.node} lost: {reason}")
        self._lost.set()

    async def _supervise(self) -> None:
        while not self._closing:
            await self._lost.wait()
            self._lost.clear()
            lost_at = time.monotonic()
            failures = 0
            while not self._closing and self._connection is None:
                try:
                    await self._attempt()
                except Exception as exc:
                    failures += 1
                    pause = backoff(failures)
                    LOG.warning(
                        "RabbitMQ node %s not usable (attempt %d since the loss): %s; "
                        "trying %s in %.1fs",
                        node_address(self.nodes[(self._next - 1) % len(self.nodes)]),
                        failures,
                        exc or type(exc).__name__,
                        node_address(self.nodes[self._next]),
                        pause,
                    )
                    await asyncio.sleep(pause)
                    continue
                LOG.info(
                    "reconnected to RabbitMQ node %s after %.1fs",
                    self.node,
                    time.monotonic() - lost_at,
                )

    async def ready(self, timeout: float) -> AbstractConnection:
        """The live connection, waiting up to ``timeout`` seconds for one."""
        if self._supervisor is None:
            raise MessagingError("the RabbitMQ transport is not connected")
        if self._connection is None:
            LOG.info("waiting for the connection to RabbitMQ to come back")
            try:
                async with asyncio.timeout(timeout):
                    while self._connection is None:
                        await self._connected.wait()
            except TimeoutError:
                raise MessagingError(
                    f"RabbitMQ at {self.where} unreachable for {timeout:g}s"
                ) from None
        connection = self._connection
        assert connection is not None
        return connection

    async def close(self) -> None:
        self._closing = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        connection, self._connection = self._connection, None
        self._connected.clear()
        if connection is not None:
            try:
                await connection.close()
            except (AMQPError, OSError) as exc:
                LOG.debug("closing the connection to RabbitMQ: %r", exc)
