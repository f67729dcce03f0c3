"""keel-api: the composition root.

Builds the database pool, the RabbitMQ transport and the RPC clients, serves the API
with uvicorn inside the running event loop until SIGTERM/SIGINT (handled by
:class:`shared.runtime.Lifecycle`, not by uvicorn), then closes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Generator, Sequence

import asyncpg
import httpx
import uvicorn
from fastapi import FastAPI

from services.api.app import create_app
from services.api.fleet_metrics import FleetGauges
from services.api.http.policy import Policy
from services.api.keystone.client import KeystoneClient, KeystoneRefused, KeystoneUnreachable
from services.api.keystone.tokens import KeystoneTokens
from services.api.metadata.app import create_metadata_app
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import NetworkSettings, Settings
from shared.db import fixed_ips
from shared.db.pool import create_pool
from shared.exceptions import KeelError
from shared.objects.service import Binary
from shared.rpc.amqp import AmqpTransport
from shared.runtime import Lifecycle, repeat, run
from shared.service_record import ServiceRecord
from shared.version_pins import Pins

LOG = logging.getLogger(__name__)

#: Seconds in-flight requests get to finish after a stop is asked for.
GRACEFUL_SHUTDOWN = 30

#: Seconds an idle kept-alive connection stays open. Clients poll on their own
#: clock -- ``openstack server create --wait`` reuses its connection every 5 s --
#: and a server that closes at the same moment the next request is sent makes the
#: client fail with "Remote end closed connection without response". Closing well
#: after any poll interval (as nginx and Apache's mod_http2 do) leaves no such race.
KEEP_ALIVE = 75


def server_config(app: FastAPI) -> uvicorn.Config:
    """uvicorn's settings for a keel listener (the API and the metadata service)."""
    return uvicorn.Config(
        app,
        log_config=None,
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
        timeout_keep_alive=KEEP_ALIVE,
    )


class ApiServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the process lifecycle owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def listen(host: str, port: int, *, setting: str = "KEEL_API_BIND") -> socket.socket:
    """Bind the API socket; a clear error if the address is taken or not ours."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Naming the protocol lets asyncio set TCP_NODELAY on every accepted connection;
    # without it a kept-alive client waits for a delayed ACK on each response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise KeelError(
            f"cannot listen on {host}:{port}: {exc.strerror}; "
            f"stop whatever uses it or change {setting}"
        ) from None
    sock.set_inheritable(True)
    return sock


async def serve_until_stopped(
    server: uvicorn.Server, sock: socket.socket, lifecycle: Lifecycle
) -> None:
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(lifecycle.stopping.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        server.should_exit = True
        stopping.cancel()
        await serving


async def prepare_network(pool: asyncpg.Pool, network: NetworkSettings) -> None:
    """Create the configured network's address pool if needed, and say how full it is."""
    try:
        async with pool.acquire() as conn:
            usage = await fixed_ips.ensure_network(conn, network)
    except asyncpg.UndefinedTableError:
        raise KeelError(
            "the database has no address pool table yet: run `keel-manage db sync` first"
        ) from None
    LOG.info(
        "servers get addresses from network %s (%s, id %s): %d of %d free",
        network.name,
        network.cidr,
        network.network_id,
        usage.free,
        usage.total,
    )


async def keystone_tokens(settings: Settings, http: httpx.AsyncClient) -> KeystoneTokens:
    """Token validation by Keystone; refuses to start if Keystone refuses keel-api's
    credentials, and starts anyway (answering 503 until it is back) if it is away."""
    client = KeystoneClient(settings.identity, http)
    try:
        await client.service_token()
    except KeystoneRefused as exc:
        raise KeelError(f"{exc.message}: keel-api cannot validate tokens") from None
    except KeystoneUnreachable as exc:
        LOG.warning("%s: requests get 503 until it answers", exc.message)
    LOG.info(
        "validating tokens with Keystone at %s, each answer cached for %gs at most; "
        "keel-api serves no identity of its own",
        client.url,
        settings.identity.token_cache_time,
    )
    return KeystoneTokens(client, settings.identity.token_cache_time)


async def serve_api(
    settings: Settings,
    lifecycle: Lifecycle,
    sock: socket.socket,
    pool: asyncpg.Pool,
    transport: AmqpTransport,
    *,
    http: httpx.AsyncClient | None = None,
) -> None:
    """Check versions, register keel-api's own row, then answer requests until stopping.

    keel-api reports its version like every service (its row is not shown by
    os-services), sends compute RPCs under the same automatic version pin as the
    conductor, and refuses to start beside compute services too old for this release.
    """
    policy = Policy.load(settings.api.policy_file)  # a bad policy file stops us here
    pins = Pins.build(pool, settings, lifecycle.metrics)
    record = ServiceRecord(pool, settings, binary=Binary.API, topic="api", minimums=pins.minimums)
    await record.check()
    await record.register()
    timeout = settings.rpc.call_timeout
    keystone = await keystone_tokens(settings, http) if http is not None else None
    app = create_app(
        settings,
        pool,
        ConductorAPI(transport, timeout=timeout, version_cap=pins.conductor.cap),
        ComputeAPI(transport, timeout=timeout, version_cap=pins.compute.cap),
        policy=policy,
        keystone=keystone,
        pins=pins,
        scheduler_cap=pins.scheduler.cap,
    )
    lifecycle.on_reload(pins.reload)
    if keystone is not None:
        lifecycle.on_reload(keystone.reload)
    config = server_config(app)
    periodic = [
        asyncio.create_task(
            repeat("heartbeat", record.heartbeat, settings.report_interval, lifecycle)
        )
    ]
    if settings.metrics_bind is not None:
        gauges = FleetGauges(pool, settings, lifecycle.metrics)
        periodic.append(
            asyncio.create_task(
                repeat("fleet metrics", gauges.refresh, settings.report_interval, lifecycle)
            )
        )
    metadata = asyncio.create_task(serve_metadata(settings, lifecycle, pool))
    LOG.info("keel-api listening on http://%s:%d/", settings.api_host, settings.api_port)
    try:
        await serve_until_stopped(ApiServer(config), sock, lifecycle)
    finally:
        lifecycle.stopping.set()
        await asyncio.gather(*periodic)
        await metadata


async def serve_metadata(settings: Settings, lifecycle: Lifecycle, pool: asyncpg.Pool) -> None:
    """The metadata service on its own listener (``KEEL_METADATA__BIND``), if one is set."""
    listen_on = settings.metadata.listen
    if listen_on is None:
        return
    host, port = listen_on
    sock = listen(host, port, setting="KEEL_METADATA__BIND")
    config = server_config(create_metadata_app(settings.metadata, pool))
    LOG.info("keel-api serving the metadata service on http://%s:%d/", host, port)
    try:
        await serve_until_stopped(ApiServer(config), sock, lifecycle)
    finally:
        sock.close()


async def serve(settings: Settings, lifecycle: Lifecycle) -> None:
    sock = listen(settings.api_host, settings.api_port)
    try:
        pool = await create_pool(settings.database_url, settings.database, lifecycle.metrics)
        try:
            await prepare_network(pool, settings.network)
            transport = AmqpTransport.from_settings(settings)
            await transport.connect()
            try:
                async with keystone_http(settings) as http:
                    await serve_api(settings, lifecycle, sock, pool, transport, http=http)
            finally:
                await transport.close()
        finally:
            await pool.close()
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def keystone_http(settings: Settings) -> AsyncIterator[httpx.AsyncClient | None]:
    """The HTTP client keel-api asks Keystone with, when it runs behind one."""
    if settings.identity.keystone_url is None:
        yield None
        return
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=20)) as http:
        yield http


def main(argv: Sequence[str] | None = None) -> None:
    run("keel-api", serve, argv, description="keel compute API (OpenStack Compute API v2.1)")


if __name__ == "__main__":
    main()
