"""Tidying the test broker: what a test declared under its own exchange goes with it."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from uuid import UUID

import aio_pika

from services.manage.broker_admin import BrokerAdmin
from services.manage.commands.agent import agent_url
from shared.config import Settings
from shared.rpc.agent_users import permissions, user_for
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


@asynccontextmanager
async def agent_user(exchange: str, service_uuid: UUID) -> AsyncIterator[str]:
    """A per-agent broker user for ``service_uuid`` on ``exchange``: its AMQP URL.

    Made through the management API as ``keel-manage agent credentials`` makes it, and
    removed afterwards.
    """
    admin = BrokerAdmin.from_settings(Settings(transport_url=AMQP_URL))
    user, password = user_for(service_uuid), secrets.token_urlsafe(16)
    await admin.put_user(user, password, permissions(exchange, service_uuid))
    try:
        yield agent_url(AMQP_URL, user, password)
    finally:
        await admin.delete_user(user)
