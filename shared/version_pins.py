"""The deployment's minimum service versions, cached, and the RPC version caps they decide.

During a rolling upgrade new and old services run side by side. A process that sends
compute (or scheduler) RPCs must not send a version the oldest receiver cannot serve,
so it caps what it sends — the *pin*:

* ``KEEL_UPGRADE_LEVELS__COMPUTE=auto`` (the default) follows the oldest compute service
  registered (deleted and forced-down services do not count): the cap is what that
  release speaks. With no compute services yet, the latest is used, and nothing is
  cached, so the first agent that registers decides the next message's version;
* a release (``bulwark`` or ``2``) pins to what that release speaks;
* ``X.Y`` pins explicitly.

A pin never rises above what this process's own release speaks. Every decision is
logged once, when it changes: ``Automatically selected compute RPC version X.Y from
minimum service version N``, and whether that is the latest or a back-level version.

:class:`MinimumVersions` is the one cache of minimum versions per process: one query per
binary per ``KEEL_SERVICE_VERSION_CACHE_TTL`` window, even when hundreds of services ask at
once (concurrent askers wait for the one query). A minimum of 0 — no services, or only
services that never reported a version — is never cached, but a registration the
conductor accepts is added to what it knows, so a start-up storm of agents costs one
query too. SIGHUP clears it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import asyncpg

from shared.config import Settings
from shared.db import services
from shared.metrics import Metrics
from shared.objects.service import Binary
from shared.versions import (
    OLDEST_SUPPORTED_SERVICE_VERSION,
    SERVICE_VERSION,
    RpcApi,
    apis_for,
    parse_version,
    release_name,
    release_number,
)

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionCounts:
    """How many live, not forced-down services of one binary run each version."""

    counts: Mapping[int, int]

    @property
    def minimum(self) -> int:
        """The oldest version running; 0 when there are no services."""
        return min(self.counts, default=0)

    @property
    def maximum(self) -> int:
        """The newest version running; 0 when there are no services."""
        return max(self.counts, default=0)


#: Reads the version counts of one binary from the database.
Fetch = Callable[[str], Awaitable[dict[int, int]]]


def fetch_from(pool: asyncpg.Pool) -> Fetch:
    async def fetch(binary: str) -> dict[int, int]:
        async with pool.acquire() as conn:
            return await services.version_counts(conn, binary)

    return fetch


def _loop_time() -> float:
    """asyncio's clock: :func:`time.monotonic` in production; in a test that drives its
    own clock (the model's), that clock, so a cached minimum ages as the test's time
    passes and nothing depends on how fast the test runs."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class MinimumVersions:
    def __init__(
        self,
        pool: asyncpg.Pool | None = None,
        *,
        ttl: float,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = _loop_time,
        fetch: Fetch | None = None,
    ) -> None:
        if fetch is None:
            assert pool is not None, "MinimumVersions needs a pool or a fetch function"
            fetch = fetch_from(pool)
        self._fetch = fetch
        self.ttl = ttl
        self.metrics = metrics or Metrics()
        self._clock = clock
        #: binary → (when it was read, what was read); only non-empty, non-zero minimums.
        self._cached: dict[str, tuple[float, VersionCounts]] = {}
        #: binary → when the database last said it has no such service.
        self._seen_empty: dict[str, float] = {}
        #: binary → the query under way, which every concurrent asker awaits.
        self._asking: dict[str, asyncio.Future[VersionCounts]] = {}

    def reset(self) -> None:
        """Forget every cached minimum (SIGHUP)."""
        self._cached.clear()
        self._seen_empty.clear()

    async def counts(self, binary: str, *, empty_is_fresh: bool = False) -> VersionCounts:
        """How many services of ``binary`` run each version, from the cache if fresh.

        An answer of "no such services" is not cached for the pins (the first service
        to register must change the next decision at once), but a caller that only
        compares a registering service with the others (``empty_is_fresh``) may reuse
        it for the TTL: registrations are noted as they happen (:meth:`note`).
        """
        cached = self._fresh(binary)
        if cached is not None:
            return cached
        empty_since = self._seen_empty.get(binary)
        if empty_is_fresh and empty_since is not None and self._within_ttl(empty_since):
            return VersionCounts({})
        asking = self._asking.get(binary)
        if asking is None:
            asking = asyncio.get_running_loop().create_future()
            self._asking[binary] = asking
            try:
                asking.set_result(await self._query(binary))
            except BaseException as exc:
                asking.set_exception(exc)
            finally:
                del self._asking[binary]
        return await asyncio.shield(asking)

    async def _query(self, binary: str) -> VersionCounts:
        self.metrics.min_version_queries.labels(binary=binary).inc()
        found = VersionCounts(await self._fetch(binary))
        now = self._clock()
        if found.minimum > 0 and self.ttl > 0:
            self._cached[binary] = (now, found)
        if not found.counts:
            self._seen_empty[binary] = now
        return found

    async def minimum(self, binary: str) -> int:
        return (await self.counts(binary)).minimum

    def note(self, binary: str, previous: int | None, version: int) -> None:
        """A service of ``binary`` (re)registered at ``version``, having been ``previous``.

        Keeps a cached minimum true without asking the database again, so a storm of
        registrations costs one query per TTL window. With nothing cached it only helps
        when the database just said there were no such services at all.
        """
        entry = self._fresh(binary)
        if entry is None:
            empty_since = self._seen_empty.get(binary)
            if previous is not None or empty_since is None or not self._within_ttl(empty_since):
                return
            self._seen_empty.pop(binary)
            if version > 0 and self.ttl > 0:
                self._cached[binary] = (empty_since, VersionCounts({version: 1}))
            return
        counts = dict(entry.counts)
        if previous is not None and counts.get(previous):
            counts[previous] -= 1
        counts[version] = counts.get(version, 0) + 1
        updated = VersionCounts({v: n for v, n in counts.items() if n > 0})
        fetched = self._cached[binary][0]
        if updated.minimum > 0:
            self._cached[binary] = (fetched, updated)
        else:
            del self._cached[binary]

    def _within_ttl(self, since: float) -> bool:
        return self._clock() - since < self.ttl

    def _fresh(self, binary: str) -> VersionCounts | None:
        entry = self._cached.get(binary)
        if entry is None:
            return None
        fetched, found = entry
        if not self._within_ttl(fetched):
            return None
        return found


_BINARIES: dict[RpcApi, Binary] = {
    "compute": Binary.COMPUTE,
    "scheduler": Binary.SCHEDULER,
    "conductor": Binary.CONDUCTOR,
}


class RpcPin:
    """The version cap of one RPC API in this process, per its ``upgrade_levels`` setting."""

    def __init__(
        self,
        api: RpcApi,
        setting: str,
        minimums: MinimumVersions,
        *,
        release: int = SERVICE_VERSION,
    ) -> None:
        self.api = api
        self.setting = setting
        self.minimums = minimums
        self.release = release
        self.binary = _BINARIES[api].value
        self._decided: tuple[str, int] | None = None

    @property
    def latest(self) -> str:
        return apis_for(self.release).version_of(self.api)

    def reconfigure(self, setting: str) -> None:
        """A new setting (SIGHUP): the next decision is logged again."""
        self.setting = setting
        self._decided = None

    async def cap(self) -> str:
        """The highest version of this API this process may send now."""
        setting = self.setting.strip().lower()
        if setting == "auto":
            return await self._automatic()
        if "." in setting:
            return self._explicit(setting)
        return self._explicit(
            apis_for(min(release_number(setting), self.release)).version_of(self.api)
        )

    def _explicit(self, version: str) -> str:
        capped = version if parse_version(version) <= parse_version(self.latest) else self.latest
        self._log_once(capped, 0, f"pinned by KEEL_UPGRADE_LEVELS__{self.api.upper()}")
        return capped

    async def _automatic(self) -> str:
        counts = await self.minimums.counts(self.binary)
        if not counts.counts:
            self._log_once(self.latest, 0, f"no {self.binary} services are registered yet")
            return self.latest
        minimum = counts.minimum
        usable = max(min(minimum, self.release), OLDEST_SUPPORTED_SERVICE_VERSION)
        version = apis_for(usable).version_of(self.api)
        self._log_once(version, minimum, "")
        return version

    def _log_once(self, version: str, minimum: int, why: str) -> None:
        if self._decided == (version, minimum):
            return
        self._decided = (version, minimum)
        level = (
            "the latest"
            if version == self.latest
            else (f"a back-level version; the latest is {self.latest}")
        )
        if why:
            LOG.info(
                "Selected %s RPC version %s (%s): %s",
                self.api,
                version,
                level,
                why,
                extra={"decision": f"{self.api}_rpc_pin"},
            )
            return
        LOG.info(
            "Automatically selected %s RPC version %s from minimum service version %d (%s)",
            self.api,
            version,
            minimum,
            f"{level}; release {release_name(minimum)}" if minimum else level,
            extra={"decision": f"{self.api}_rpc_pin"},
        )


@dataclass
class Pins:
    """What a process that sends compute and scheduler RPCs decides its versions with."""

    minimums: MinimumVersions
    compute: RpcPin
    scheduler: RpcPin
    conductor: RpcPin

    @classmethod
    def build(cls, pool: asyncpg.Pool, settings: Settings, metrics: Metrics) -> Pins:
        minimums = MinimumVersions(pool, ttl=settings.service_version_cache_ttl, metrics=metrics)
        release = settings.service_version
        levels = settings.upgrade_levels
        return cls(
            minimums=minimums,
            compute=RpcPin("compute", levels.compute, minimums, release=release),
            scheduler=RpcPin("scheduler", levels.scheduler, minimums, release=release),
            conductor=RpcPin("conductor", levels.conductor, minimums, release=release),
        )

    async def reload(self, settings: Settings) -> None:
        """SIGHUP: forget cached versions and decisions, then decide (and log) afresh."""
        self.minimums.ttl = settings.service_version_cache_ttl
        self.minimums.reset()
        self.compute.reconfigure(settings.upgrade_levels.compute)
        self.scheduler.reconfigure(settings.upgrade_levels.scheduler)
        self.conductor.reconfigure(settings.upgrade_levels.conductor)
        await self.compute.cap()
        await self.scheduler.cap()
        await self.conductor.cap()
