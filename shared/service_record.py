"""A database-backed service's own row in ``services``, kept alive by heartbeats.

keel-conductor and keel-scheduler have database access, so they stamp their own rows
directly; compute agents heartbeat through the conductor instead. Several copies of one
service on one host share one row.
"""

from __future__ import annotations

import logging

import asyncpg

from shared.config import Settings
from shared.db import services
from shared.exceptions import ServiceNotFound
from shared.objects.service import Binary, Service
from shared.versions import SERVICE_VERSION

LOG = logging.getLogger(__name__)


class ServiceRecord:
    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        binary: Binary,
        topic: str,
        version: int = SERVICE_VERSION,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.binary = binary
        self.topic = topic
        self.version = version
        self.service: Service | None = None

    async def register(self) -> Service:
        """Create or refresh the row for (host, binary), with this release's version."""
        async with self.pool.acquire() as conn:
            self.service = await services.get_or_create(
                conn,
                host=self.settings.host,
                binary=self.binary.value,
                topic=self.topic,
                version=self.version,
                down_time=self.settings.service_down_time,
            )
        LOG.info(
            "registered as %s service %s (host %s, version %d)",
            self.binary.value,
            self.service.uuid,
            self.service.host,
            self.version,
        )
        return self.service

    async def heartbeat(self) -> None:
        """Stamp ``last_seen_up`` and the version; register again if the row was deleted."""
        service = self.service or await self.register()
        try:
            async with self.pool.acquire() as conn:
                await services.heartbeat(conn, service.uuid, self.version)
        except ServiceNotFound:
            LOG.warning("service row %s was deleted; registering again", service.uuid)
            service = await self.register()
            async with self.pool.acquire() as conn:
                await services.heartbeat(conn, service.uuid, self.version)
