"""The baseline for keel's RPC: request/response written directly on aio-pika.

Everything keel's RPC adds is left out (envelope, pydantic models, version checks,
settlement policy, dead-lettering), and everything the broker does for keel is kept, so
the ratio of the two rates is the cost of keel's layer: the request goes to a quorum
queue through a topic exchange, published ``mandatory`` on a channel with publisher
confirms; the server, with the same prefetch, answers on the default exchange to the
caller's exclusive reply queue and acknowledges; the caller matches the answer by
correlation id, as ``aio_pika.patterns.RPC`` does. Client and server have their own
connections, as two processes would.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from benchkit.load import LoadResult, run_load

QUEUE_ARGUMENTS: dict[str, Any] = {"x-queue-type": "quorum"}


class RawRpc:
    def __init__(self, url: str, exchange: str, prefetch: int) -> None:
        self.url = url
        self.exchange_name = f"{exchange}.raw"
        self.queue_name = f"{exchange}.raw.echo"
        self.prefetch = prefetch
        self._waiting: dict[str, asyncio.Future[bytes]] = {}

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RawRpc]:
        server = await aio_pika.connect(self.url)
        client = await aio_pika.connect(self.url)
        try:
            await self._serve(server)
            await self._connect_client(client)
            yield self
        finally:
            channel = await client.channel()
            await channel.queue_delete(self.queue_name)
            await channel.exchange_delete(self.exchange_name)
            await client.close()
            await server.close()

    async def _serve(self, connection: aio_pika.abc.AbstractConnection) -> None:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        exchange = await channel.declare_exchange(
            self.exchange_name, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(
            self.queue_name, durable=True, arguments=QUEUE_ARGUMENTS
        )
        await queue.bind(exchange, routing_key="call.echo")

        async def answer(message: AbstractIncomingMessage) -> None:
            reply = aio_pika.Message(message.body, correlation_id=message.correlation_id)
            await channel.default_exchange.publish(reply, routing_key=message.reply_to or "")
            await message.ack()

        await queue.consume(answer)

    async def _connect_client(self, connection: aio_pika.abc.AbstractConnection) -> None:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await channel.get_exchange(self.exchange_name)
        replies = await channel.declare_queue(exclusive=True, auto_delete=True)
        self._reply_to = replies.name

        async def on_reply(message: AbstractIncomingMessage) -> None:
            future = self._waiting.pop(message.correlation_id or "", None)
            if future is not None and not future.done():
                future.set_result(message.body)

        await replies.consume(on_reply, no_ack=True)

    async def call(self, body: bytes) -> bytes:
        correlation_id = str(uuid.uuid4())
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        message = aio_pika.Message(
            body,
            correlation_id=correlation_id,
            reply_to=self._reply_to,
            delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT,
        )
        await self._exchange.publish(message, routing_key="call.echo", mandatory=True)
        return await future


async def measure_raw(rpc: RawRpc, calls: int, concurrency: int, payload: bytes) -> LoadResult:
    async def call(index: int) -> None:
        await rpc.call(payload)

    return await run_load(call, calls, concurrency)
