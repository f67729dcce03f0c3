"""RPC layer throughput and latency over the real RabbitMQ.

What is measured: keel's ``RPCClient`` → ``AmqpTransport`` → RabbitMQ → ``RPCServer``
path with a trivial echo endpoint, so the figures are the cost of the RPC layer itself
(envelope and pydantic encoding, publisher confirms, routing, the reply queue):

* ``rpc call``: ``--calls`` echo calls at each ``--concurrency``; calls/s and the
  round-trip latency percentiles;
* ``rpc raw aio-pika``: the same calls written directly on aio-pika, in the same run
  (``benchkit/raw_rpc.py``), and ``rpc ratio``, keel's rate over the raw one (target
  ≥ 0.7, printed as PASS/FAIL);
* ``rpc cast``: ``--casts`` casts sent with ``--cast-concurrency`` in flight; the send
  latency (until the broker confirmed the message) and casts/s, counted until the server
  has handled every cast.

Client and server each have their own transport (their own connection), as two keel
processes would. The server takes ``--prefetch`` messages at once (keel's default unless
given). Everything lives on a fresh exchange ``keel-bench-<hex>`` whose queues expire on
their own after 60 s; the exchanges, the dead-letter queues and the topic queue are
deleted at the end, even on failure. Timing targets are printed, never enforced.

Run it with ``make bench`` (all benchmarks) or::

    .venv/bin/python bench/rpc.py --calls 5000 --concurrency 1 100 --casts 10000
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aio_pika
from benchkit import LoadResult, figures, report, run_load, target
from benchkit.raw_rpc import RawRpc, measure_raw
from pydantic import BaseModel

from shared.config import RpcSettings
from shared.context import RequestContext
from shared.rpc.amqp import AmqpTransport
from shared.rpc.amqp_topology import Topology
from shared.rpc.client import RPCClient
from shared.rpc.server import RPCServer

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
TOPIC = "bench"
VERSION = "1.0"
#: Seconds the server gets to handle every cast before the benchmark gives up.
CAST_DEADLINE = 60.0
WARM_UP_CALLS = 50


class Echo(BaseModel):
    seq: int
    payload: str


class EchoEndpoint:
    """The benchmark's RPC server: answers ``echo`` calls and counts ``record`` casts."""

    def __init__(self) -> None:
        self.recorded = 0
        self.expected = 0
        self.all_recorded = asyncio.Event()

    def expect(self, casts: int) -> None:
        """Start counting casts afresh; ``all_recorded`` is set once ``casts`` arrived."""
        self.recorded = 0
        self.expected = casts
        self.all_recorded.clear()

    async def echo(self, ctx: RequestContext, req: Echo) -> Echo:
        return req

    async def record(self, ctx: RequestContext, req: Echo) -> None:
        self.recorded += 1
        if self.recorded >= self.expected:
            self.all_recorded.set()


@dataclass(frozen=True)
class Options:
    calls: int
    concurrency: tuple[int, ...]
    casts: int
    cast_concurrency: int
    payload_bytes: int
    prefetch: int
    amqp_url: str


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per run (3000)")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 100],
        help="calls in flight; one run per value (default 1 100)",
    )
    parser.add_argument("--casts", type=int, default=5000, help="casts to send (5000)")
    parser.add_argument(
        "--cast-concurrency", type=int, default=32, help="casts in flight while sending (32)"
    )
    parser.add_argument("--payload-bytes", type=int, default=128, help="payload size (128)")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=RpcSettings().prefetch,
        help="messages the server holds at once (default: keel's default)",
    )
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP_URL, help="RabbitMQ URL")
    args = parser.parse_args(argv)
    counts = (args.calls, args.casts, args.cast_concurrency, args.prefetch, *args.concurrency)
    if min(counts) < 1 or args.payload_bytes < 0:
        parser.error("every count must be at least 1")
    return Options(
        calls=args.calls,
        concurrency=tuple(args.concurrency),
        casts=args.casts,
        cast_concurrency=args.cast_concurrency,
        payload_bytes=args.payload_bytes,
        prefetch=args.prefetch,
        amqp_url=args.amqp_url,
    )


async def delete_exchange(amqp_url: str, exchange: str) -> None:
    """Remove what the transports declared under ``exchange``."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await Topology(exchange).delete(await connection.channel(), (TOPIC,))


@asynccontextmanager
async def connected(url: str, exchange: str) -> AsyncIterator[AmqpTransport]:
    transport = AmqpTransport(url, exchange, queue_expires=60, connect_timeout=10)
    await transport.connect()
    try:
        yield transport
    finally:
        await transport.close()


async def measure_calls(
    client: RPCClient, calls: int, concurrency: int, payload_bytes: int
) -> LoadResult:
    ctx = RequestContext.internal()
    payload = "x" * payload_bytes

    async def call(index: int) -> None:
        await client.call(ctx, "echo", Echo(seq=index, payload=payload), version=VERSION)

    return await run_load(call, calls, concurrency)


async def measure_casts(
    client: RPCClient, endpoint: EchoEndpoint, options: Options
) -> tuple[LoadResult, float]:
    """Send every cast; return the sending figures and seconds until all were handled."""
    ctx = RequestContext.internal()
    payload = "x" * options.payload_bytes

    async def cast(index: int) -> None:
        await client.cast(ctx, "record", Echo(seq=index, payload=payload), version=VERSION)

    endpoint.expect(options.casts)
    started = time.perf_counter()
    sent = await run_load(cast, options.casts, options.cast_concurrency)
    try:
        async with asyncio.timeout(CAST_DEADLINE):
            await endpoint.all_recorded.wait()
    except TimeoutError:
        return sent, float("nan")
    return sent, time.perf_counter() - started


async def compare_calls(client: RPCClient, options: Options, exchange: str) -> None:
    """keel's call rate and the raw aio-pika rate, one after the other, per concurrency."""
    raw = RawRpc(options.amqp_url, exchange, options.prefetch)
    payload = Echo(seq=0, payload="x" * options.payload_bytes).model_dump_json().encode()
    async with raw.running():
        await measure_calls(client, WARM_UP_CALLS, 1, options.payload_bytes)
        await measure_raw(raw, WARM_UP_CALLS, 1, payload)
        for concurrency in options.concurrency:
            keel = await measure_calls(client, options.calls, concurrency, options.payload_bytes)
            report("rpc call", figures(keel, noun="calls"))
            baseline = await measure_raw(raw, options.calls, concurrency, payload)
            report("rpc raw aio-pika", figures(baseline, noun="calls"))
            ratio = keel.rate / baseline.rate
            report("rpc ratio", {"concurrency": concurrency, "keel/raw": ratio})
            target(f"rpc ratio keel/raw, concurrency {concurrency}", ratio, at_least=0.7)


async def run_benchmark(options: Options, exchange: str) -> bool:
    """Every measurement on ``exchange``; False if not every cast was handled."""
    endpoint = EchoEndpoint()
    async with (
        connected(options.amqp_url, exchange) as server_side,
        connected(options.amqp_url, exchange) as client_side,
    ):
        server = RPCServer(server_side, TOPIC, endpoint, version=VERSION)
        await server.start(prefetch=options.prefetch)
        try:
            client = RPCClient(client_side, TOPIC, version_cap=VERSION, timeout=30.0)
            await compare_calls(client, options, exchange)
            sent, handled_in = await measure_casts(client, endpoint, options)
        finally:
            await server.stop(drain_timeout=5.0)
    report(
        "rpc cast",
        {
            **figures(sent, noun="casts"),
            "handled": endpoint.recorded,
            "handled_in_s": handled_in,
            "handled/s": endpoint.recorded / handled_in,
        },
    )
    return endpoint.recorded == options.casts


async def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    exchange = f"keel-bench-{uuid.uuid4().hex[:12]}"
    report(
        "rpc setup",
        {
            "exchange": exchange,
            "payload_bytes": options.payload_bytes,
            "prefetch": options.prefetch,
        },
    )
    try:
        passed = await run_benchmark(options, exchange)
    finally:
        await delete_exchange(options.amqp_url, exchange)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
