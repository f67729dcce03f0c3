"""The test broker: its URL, removing a test's exchange (both from :mod:`devkit`), and
per-agent users."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

from devkit.broker import remove_exchange
from devkit.servers import AMQP_URL
from services.manage.broker_admin import BrokerAdmin
from services.manage.commands.agent import agent_url
from shared.config import Settings
from shared.rpc.agent_users import permissions, user_for

__all__ = ["AMQP_URL", "agent_user", "remove_exchange"]


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
