"""Refusing to run when too old, or beside services too old for this release.

Two checks, both made before anything is written:

* a service registering with a version older than every other service of its binary —
  its own earlier row does not count, so an ancient host returning after a long absence
  is caught too, and forced-down and deleted rows count on neither side — is refused
  with ``This service is older (vX) than the minimum (vY) version of the rest of the
  deployment. Unable to continue.``, and a running service
  whose heartbeat reports a version older than this release supports is refused the
  same way (the agent then exits);
* conductor, scheduler and api refuse to start while a compute service older than
  ``OLDEST_SUPPORTED_SERVICE_VERSION`` is registered, naming the hosts and versions,
  unless ``KEEL_WORKAROUNDS__DISABLE_COMPUTE_SERVICE_CHECK_FOR_FFU`` is set (a
  fast-forward upgrade), which turns the refusal into a warning.
"""

from __future__ import annotations

import logging

import asyncpg

from shared.config import Settings
from shared.db import services
from shared.exceptions import ServiceTooOld
from shared.objects.service import Binary
from shared.version_pins import MinimumVersions
from shared.versions import OLDEST_SUPPORTED_SERVICE_VERSION, SERVICE_VERSION

LOG = logging.getLogger(__name__)

FFU_SETTING = "KEEL_WORKAROUNDS__DISABLE_COMPUTE_SERVICE_CHECK_FOR_FFU"


def too_old(version: int, minimum: int) -> ServiceTooOld:
    return ServiceTooOld(
        f"This service is older (v{version}) than the minimum (v{minimum}) version of the "
        "rest of the deployment. Unable to continue."
    )


def refuse_if_older_than_the_rest(rest: int, version: int) -> None:
    """Raise :class:`ServiceTooOld` if ``version`` is older than ``rest``, the oldest
    version of every other service of its binary (0 when there is none)."""
    if rest and version < rest:
        raise too_old(version, rest)


async def check_against_the_rest(
    pool: asyncpg.Pool, minimums: MinimumVersions, *, binary: str, host: str, version: int
) -> int | None:
    """Refuse ``version`` if it is older than every other service of ``binary``.

    Both sides are counted alike: deleted and forced-down rows never count, and the
    service's own row (``host``) is left out of the rest whatever its state. Returns the
    version of the own row as the counts have it (``None`` if it is not counted).

    When ``version`` is at least the newest version known (this release's, and every
    cached count's), nothing can be newer and the cached counts answer; otherwise the
    database does, so a stale cache never lets an older service in.
    """
    async with pool.acquire() as conn:
        own = await services.counted_version(conn, host, binary)
    # Not holding a connection: the cache's one query for many callers needs one.
    counts = await minimums.counts(binary, empty_is_fresh=True)
    if version >= max(counts.maximum, SERVICE_VERSION):
        return own
    async with pool.acquire() as conn:
        rest = await services.minimum_of_the_rest(conn, binary, host)
    refuse_if_older_than_the_rest(rest, version)
    return own


def refuse_if_unsupported(version: int) -> None:
    """Raise :class:`ServiceTooOld` if ``version`` is older than this release supports."""
    if version < OLDEST_SUPPORTED_SERVICE_VERSION:
        raise too_old(version, OLDEST_SUPPORTED_SERVICE_VERSION)


async def check_computes_supported(pool: asyncpg.Pool, settings: Settings, who: str) -> None:
    """Refuse to start (or warn) while too old a compute service is registered."""
    async with pool.acquire() as conn:
        ancient = await services.older_than(
            conn,
            Binary.COMPUTE.value,
            OLDEST_SUPPORTED_SERVICE_VERSION,
            settings.service_down_time,
        )
    if not ancient:
        return
    listing = ", ".join(f"{service.host} (v{service.version})" for service in ancient)
    problem = (
        f"compute services older than this release supports (v"
        f"{OLDEST_SUPPORTED_SERVICE_VERSION}) are registered: {listing}"
    )
    if settings.workarounds.disable_compute_service_check_for_ffu:
        LOG.warning(
            "%s starts anyway (%s is set): %s; upgrade them before using them",
            who,
            FFU_SETTING,
            problem,
        )
        return
    raise ServiceTooOld(
        f"{problem}. Upgrade them, or delete them (`openstack compute service delete`) if "
        f"they are gone; during a fast-forward upgrade set {FFU_SETTING}=true to start anyway."
    )
