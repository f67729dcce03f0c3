"""Tidying the test broker: what a test declared under its own exchange goes with it."""

from __future__ import annotations

import os

import aio_pika

AMQP_URL = os.environ.get("KEEL_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")


async def remove_exchange(name: str) -> None:
    """Delete exchange ``name``, its dead-letter exchange and queue (idempotent).

    Topic and reply queues are left to expire on their own (tests set ``queue_expires``).
    """
    connection = await aio_pika.connect(AMQP_URL)
    async with connection:
        channel = await connection.channel()
        for exchange in (name, f"{name}.dlx"):
            await channel.exchange_delete(exchange)
        await channel.queue_delete(f"{name}.dead-letter")
