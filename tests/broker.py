"""Tidying the test broker: what a test declared under its own exchange goes with it."""

from __future__ import annotations

import os
from collections.abc import Sequence

import aio_pika

from shared.rpc.amqp_topology import Topology

AMQP_URL = os.environ.get("KEEL_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")


async def remove_exchange(name: str, topics: Sequence[str] = ()) -> None:
    """Delete exchange ``name``, its dead-letter exchange and queues, and ``topics``' queues.

    Idempotent. Queues of other topics are left to expire on their own (tests set
    ``queue_expires``).
    """
    connection = await aio_pika.connect(AMQP_URL)
    async with connection:
        await Topology(name).delete(await connection.channel(), topics)
