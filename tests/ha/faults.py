"""What the HA acceptance tests share: boots while a fault happens, and what must hold."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from benchkit.clients import Boots, boot_many
from benchkit.ha import Stage
from benchkit.outcome import Outcome, outcome

from devkit.readiness import wait_until

BOOTS = 200
CLIENTS = 20
#: Seconds the cloud may take to settle and every service to report up again.
SETTLE = 240.0


async def boots_through(
    stage: Stage, fault: Callable[[], Awaitable[None]], *, after: int = BOOTS // 4
) -> Boots:
    """``BOOTS`` boots from ``CLIENTS`` clients on both APIs; ``fault`` runs once ``after``
    of them were answered."""
    boots = Boots()

    async def inject() -> None:
        async def far_enough() -> bool:
            return boots.done >= after

        await wait_until(far_enough, what="the moment for the fault", timeout=SETTLE)
        await fault()

    cloud = stage.cloud
    await asyncio.gather(
        inject(),
        boot_many(cloud.api_urls, cloud.token, boots, boots=BOOTS, clients=CLIENTS),
    )
    return boots


async def assert_whole(stage: Stage, boots: Boots, pids: dict[str, int]) -> Outcome:
    """Every accepted server ended ACTIVE or ERROR exactly once; nothing else exists; no
    keel process exited; every service reports up again, without a restart."""
    assert boots.done == BOOTS
    assert len(boots.accepted) == BOOTS, boots.answers
    result = await outcome(stage, boots.accepted)
    assert result.lost == 0, result
    assert result.duplicated == 0, result
    assert result.stuck == 0, result
    assert result.usage_drift == 0, result
    assert set(result.states) <= {"active", "error"}, result
    assert sum(result.states.values()) == len(boots.accepted)
    assert set(boots.seen.values()) <= {"ACTIVE", "ERROR"}, boots.seen
    assert stage.restarted_or_dead(pids, killed=set()) == [], stage.cloud.tails()
    await all_services_up(stage)
    return result


async def all_services_up(stage: Stage) -> None:
    """Every conductor, scheduler and agent heartbeats again (after reconnecting)."""
    cloud = stage.cloud
    shape = cloud.shape

    async def up() -> bool:
        return (
            await cloud.up_count("keel-conductor") == shape.conductors
            and await cloud.up_count("keel-scheduler") == shape.schedulers
            and await cloud.up_count("keel-compute") == len(stage.hosts)
        )

    await wait_until(up, what="every service up", timeout=SETTLE)


async def boots_after(stage: Stage, count: int = 4) -> None:
    """A few more boots once the fault is over: all ACTIVE, on any API."""
    boots = Boots()
    await boot_many(stage.cloud.api_urls, stage.cloud.token, boots, boots=count, clients=count)
    assert boots.answers == {"202": count}, boots.answers
    assert set(boots.seen.values()) == {"ACTIVE"}, boots.seen
