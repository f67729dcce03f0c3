"""The minimum-version cache and the RPC pins it decides, with a clock the test moves."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared.exceptions import ServiceTooOld
from shared.metrics import Metrics
from shared.version_checks import refuse_if_older_than_the_rest, refuse_if_unsupported
from shared.version_pins import MinimumVersions, RpcPin, VersionCounts
from shared.versions import SERVICE_VERSION, apis_for

COMPUTE = "keel-compute"


class Deployment:
    """Version counts per binary, as the database would answer, and how often it was asked."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[int, int]] = {}
        self.asked = 0
        self.gate: asyncio.Event | None = None

    async def fetch(self, binary: str) -> dict[int, int]:
        self.asked += 1
        if self.gate is not None:
            await self.gate.wait()
        return dict(self.counts.get(binary, {}))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def deployment() -> Deployment:
    return Deployment()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def minimums(deployment: Deployment, clock: Clock, ttl: float = 60.0) -> MinimumVersions:
    return MinimumVersions(ttl=ttl, clock=clock, fetch=deployment.fetch, metrics=Metrics())


async def test_the_minimum_is_cached_for_the_ttl(deployment: Deployment, clock: Clock) -> None:
    deployment.counts[COMPUTE] = {1: 1, 3: 4}
    cache = minimums(deployment, clock, ttl=5)

    assert await cache.minimum(COMPUTE) == 1
    deployment.counts[COMPUTE] = {3: 5}
    clock.now += 4.9
    assert await cache.minimum(COMPUTE) == 1
    clock.now += 0.2
    assert await cache.minimum(COMPUTE) == 3
    assert deployment.asked == 2


async def test_no_services_is_never_cached(deployment: Deployment, clock: Clock) -> None:
    cache = minimums(deployment, clock)

    assert await cache.minimum(COMPUTE) == 0
    deployment.counts[COMPUTE] = {1: 1}
    assert await cache.minimum(COMPUTE) == 1
    assert deployment.asked == 2


async def test_a_version_zero_row_is_oldest_and_never_cached(
    deployment: Deployment, clock: Clock
) -> None:
    deployment.counts[COMPUTE] = {0: 1, 3: 2}
    cache = minimums(deployment, clock)

    assert await cache.minimum(COMPUTE) == 0
    assert await cache.minimum(COMPUTE) == 0
    assert deployment.asked == 2


async def test_a_storm_of_askers_makes_one_query_per_binary(
    deployment: Deployment, clock: Clock
) -> None:
    deployment.counts[COMPUTE] = {3: 200}
    deployment.gate = asyncio.Event()
    metrics = Metrics()
    cache = MinimumVersions(ttl=60, clock=clock, fetch=deployment.fetch, metrics=metrics)

    asking = [asyncio.create_task(cache.minimum(COMPUTE)) for _ in range(200)]
    await asyncio.sleep(0)
    deployment.gate.set()
    results = await asyncio.gather(*asking)

    assert set(results) == {3}
    assert deployment.asked == 1
    assert metrics.value("keel_min_service_version_queries_total", binary=COMPUTE) == 1


async def test_reset_forgets_what_was_cached(deployment: Deployment, clock: Clock) -> None:
    deployment.counts[COMPUTE] = {1: 1}
    cache = minimums(deployment, clock, ttl=3600)
    assert await cache.minimum(COMPUTE) == 1
    deployment.counts[COMPUTE] = {3: 1}

    cache.reset()

    assert await cache.minimum(COMPUTE) == 3


def test_minimum_and_maximum_of_the_counts() -> None:
    counts = VersionCounts({1: 1, 3: 2})
    assert (counts.minimum, counts.maximum) == (1, 3)
    assert (VersionCounts({}).minimum, VersionCounts({}).maximum) == (0, 0)


async def test_auto_pin_follows_the_oldest_compute_and_logs_each_decision(
    deployment: Deployment, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shared.version_pins")
    cache = minimums(deployment, clock, ttl=5)
    pin = RpcPin("compute", "auto", cache)
    latest = apis_for(SERVICE_VERSION).compute

    assert await pin.cap() == latest  # no computes yet: the latest, not cached
    deployment.counts[COMPUTE] = {1: 1}
    assert await pin.cap() == "1.0"
    assert await pin.cap() == "1.0"
    deployment.counts[COMPUTE] = {SERVICE_VERSION: 2}
    clock.now += 5
    assert await pin.cap() == latest

    decisions = [r.getMessage() for r in caplog.records if "RPC version" in r.getMessage()]
    assert len(decisions) == 3
    assert decisions[1].startswith(
        "Automatically selected compute RPC version 1.0 from minimum service version 1"
    )
    assert "back-level" in decisions[1]
    assert decisions[2].startswith(
        f"Automatically selected compute RPC version {latest} from minimum service version "
        f"{SERVICE_VERSION}"
    )
    assert "the latest" in decisions[2]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [("1.0", "1.0"), ("arbor", "1.0"), ("1", "1.0"), ("9.9", apis_for(SERVICE_VERSION).compute)],
)
async def test_explicit_pins(
    deployment: Deployment, clock: Clock, setting: str, expected: str
) -> None:
    deployment.counts[COMPUTE] = {SERVICE_VERSION: 1}
    pin = RpcPin("compute", setting, minimums(deployment, clock))
    assert await pin.cap() == expected
    assert deployment.asked == 0


async def test_an_emulated_older_release_never_sends_above_its_own_versions(
    deployment: Deployment, clock: Clock
) -> None:
    deployment.counts[COMPUTE] = {SERVICE_VERSION: 3}
    pin = RpcPin("compute", "auto", minimums(deployment, clock), release=1)
    assert await pin.cap() == "1.0"


def test_older_than_every_other_service_is_refused() -> None:
    with pytest.raises(ServiceTooOld) as refused:
        refuse_if_older_than_the_rest(3, version=1)
    assert refused.value.message == (
        "This service is older (v1) than the minimum (v3) version of the rest of the "
        "deployment. Unable to continue."
    )
    refuse_if_older_than_the_rest(3, version=3)
    refuse_if_older_than_the_rest(1, version=1)
    # No other service at all: nothing to be older than.
    refuse_if_older_than_the_rest(0, version=1)


def test_unsupported_versions_are_refused() -> None:
    with pytest.raises(ServiceTooOld, match=r"older \(v0\) than the minimum \(v1\)"):
        refuse_if_unsupported(0)
    refuse_if_unsupported(1)


async def test_registrations_keep_the_cache_true_without_asking_again(
    deployment: Deployment, clock: Clock
) -> None:
    cache = minimums(deployment, clock)
    # A storm from an empty deployment: one query, then every registration is noted.
    assert await cache.minimum(COMPUTE) == 0
    for _ in range(200):
        cache.note(COMPUTE, None, 3)
    assert await cache.minimum(COMPUTE) == 3
    assert deployment.asked == 1

    cache.note(COMPUTE, None, 1)  # an older agent joins
    assert await cache.minimum(COMPUTE) == 1
    cache.note(COMPUTE, 1, 3)  # and is upgraded in place
    assert await cache.minimum(COMPUTE) == 3
    assert deployment.asked == 1


async def test_a_note_does_not_invent_a_minimum_it_never_read(
    deployment: Deployment, clock: Clock
) -> None:
    deployment.counts[COMPUTE] = {1: 1}
    cache = minimums(deployment, clock, ttl=5)
    assert await cache.minimum(COMPUTE) == 1
    clock.now += 10  # the cached minimum expired: a note must not stand in for the database

    cache.note(COMPUTE, None, 3)

    assert await cache.minimum(COMPUTE) == 1
    assert deployment.asked == 2


async def test_by_default_a_cached_minimum_ages_on_the_event_loops_clock(
    deployment: Deployment, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio's clock, not the wall's: a test that drives its loop's time (the model)
    sees the cache expire as its time passes, however fast it runs."""
    deployment.counts[COMPUTE] = {3: 1}
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    cache = MinimumVersions(ttl=60, fetch=deployment.fetch, metrics=Metrics())

    assert await cache.minimum(COMPUTE) == 3
    deployment.counts[COMPUTE] = {4: 1}
    clock.now += 59
    assert await cache.minimum(COMPUTE) == 3
    clock.now += 2
    assert await cache.minimum(COMPUTE) == 4
    assert deployment.asked == 2
