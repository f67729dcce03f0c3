"""The test broker: waiting until it answers, and removing what a run declared on it.

A harness declares its own exchange (and so queue prefix) per cloud or test; removing
it takes the exchange, its dead-letter exchange and queues, and the queues of the topics
named. Queues of other topics expire on their own (harnesses set ``queue_expires``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import aio_pika

from devkit.servers import AMQP_URL
from shared.rpc.amqp_topology import Topology

LOG = logging.getLogger(__name__)


class BrokerNotAnswering(Exception):
    """RabbitMQ did not open a connection and a channel in time."""


async def remove_exchange(
    name: str, topics: Sequence[str] = (), *, url: str = AMQP_URL, channels: int = 1
) -> float:
    """Delete exchange ``name`` with its dead letters and ``topics``' queues; seconds taken.

    Idempotent. Each queue deletion waits for the broker, so a cloud with many topics
    deletes them over ``channels`` channels at once.
    """
    topology = Topology(name)
    began = time.monotonic()
    connection = await aio_pika.connect(url)
    async with connection:
        opened = [await connection.channel() for _ in range(max(1, channels))]

        async def delete(index: int) -> None:
            for topic in topics[index :: len(opened)]:
                await opened[index].queue_delete(topology.queue_name(topic))

        await asyncio.gather(*(delete(index) for index in range(len(opened))))
        await topology.delete(opened[0])
    return time.monotonic() - began


async def wait_for_broker(timeout: float, *, url: str = AMQP_URL) -> float:
    """Until RabbitMQ opens a connection and a channel promptly (it may still be busy
    deleting an earlier run's queues); the seconds waited."""
    began = time.monotonic()
    while True:
        try:
            connection = await aio_pika.connect(url, timeout=5)
            async with connection:
                await connection.channel()
            return time.monotonic() - began
        except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as exc:
            if time.monotonic() - began > timeout:
                raise BrokerNotAnswering(
                    f"RabbitMQ did not answer within {timeout:g}s: {exc!r}"
                ) from None
            LOG.warning("waiting for RabbitMQ (%r)", exc)
            await asyncio.sleep(2)
