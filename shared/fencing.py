"""When a compute host that stopped heartbeating counts as fenced: its guests are off.

A host whose heartbeat is stale may only be cut off, its guests still running; rebuilding
them elsewhere would run two copies. Its servers may be evacuated (by an operator, or by
the conductors' automatic evacuation) only once the host is **fenced**:

* an operator **forced it down** (``openstack compute service set --down``): that is the
  operator's assertion that the host is off, as Kubernetes' out-of-service taint is; or
* its agent **fences itself** — it runs a release that reports its
  ``KEEL_FENCING__SELF_FENCE_AFTER`` (:data:`~shared.versions.SELF_FENCING_VERSION`) and
  that setting is not 0 — and its last heartbeat is older than the service down time
  plus that window plus ``KEEL_FENCING__MARGIN``. The agent powers its guests off once it
  has gone the window without a successful heartbeat, counted from the moment it sent
  the last one that succeeded, so from no later than the heartbeat the database
  recorded; the down time and the margin are its time to power them off.

:func:`fence_state` decides from the service row and the seconds since its last
heartbeat (by the database's clock: :func:`silent_for`); keel-api's ``evacuate`` and the
conductors' automatic evacuation both ask it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from shared.db.pool import Connection
from shared.objects.service import Service
from shared.versions import SELF_FENCING_VERSION, release_name


@dataclass(frozen=True)
class FenceState:
    """Whether a compute service's host counts as fenced, and why."""

    host: str
    #: The host is off, or taken to be: its servers may be evacuated.
    fenced: bool
    #: One sentence for an operator (an API fault, a log line).
    why: str
    #: Seconds until it counts as fenced, if waiting is all it takes.
    seconds_left: float | None = None
    #: The service is up: nothing is fenced and nothing may be evacuated.
    up: bool = False


def fence_state(
    service: Service, silent_for: float | None, *, down_time: float, margin: float
) -> FenceState:
    """Whether ``service``'s host is fenced, ``silent_for`` seconds after its last heartbeat
    (``None``: it never sent one); see the module's text."""
    host = service.host
    if service.forced_down:
        return FenceState(host, True, f"{host} was forced down by an operator")
    if service.is_up:
        return FenceState(host, False, f"Compute service of {host} is still in use.", up=True)
    fence = service.self_fence_after
    if service.version < SELF_FENCING_VERSION or fence is None:
        return FenceState(
            host,
            False,
            f"Compute service of {host} is down, but its agent (release "
            f"{release_name(service.version)}) does not fence itself: its servers may still "
            "run. Make sure the host is off, then force its service down (openstack compute "
            "service set --down) and evacuate again.",
        )
    if fence <= 0:
        return FenceState(
            host,
            False,
            f"Compute service of {host} is down, but its agent does not fence itself "
            "(KEEL_FENCING__SELF_FENCE_AFTER=0): its servers may still run. Make sure the "
            "host is off, then force its service down (openstack compute service set "
            "--down) and evacuate again.",
        )
    window = down_time + fence + margin
    if silent_for is None:
        return FenceState(
            host,
            False,
            f"Compute service of {host} is down and has never sent a heartbeat: keel cannot "
            "tell whether its servers run. Make sure the host is off, then force its "
            "service down (openstack compute service set --down) and evacuate again.",
        )
    if silent_for >= window:
        return FenceState(
            host,
            True,
            f"{host} fenced itself: no heartbeat for {silent_for:.0f}s, past its self-fence "
            f"window of {fence:g}s plus the down time ({down_time:g}s) and the margin "
            f"({margin:g}s)",
        )
    left = window - silent_for
    return FenceState(
        host,
        False,
        f"Compute service of {host} is down but not yet fenced: its agent powers its "
        f"servers off after {fence:g}s without a heartbeat, and they may be evacuated "
        f"{math.ceil(left):d}s from now ({down_time:g}s down time + {fence:g}s + "
        f"{margin:g}s margin since its last heartbeat, {silent_for:.0f}s ago). Try again "
        "then, or force its service down if the host is off.",
        seconds_left=left,
    )


def stray_copy_may_run(service: Service, *, ended_at: datetime | None = None) -> bool:
    """Whether a copy that a move left on ``service``'s host when it ended unfinished
    (past its deadline) may still be running there.

    Such a copy is explained by no live move: the host's agent stops it when it reports
    its guests, which it does before its first heartbeat and again after any loss of
    contact. So it is known to be off once an operator forced the host down, or once the
    agent has heartbeated since ``ended_at``; with no ``ended_at`` (the move is being
    ended now), once the agent is up, as the caller then tells it what to do with the
    copy. Self-fencing does not count here: an agent that died fences nothing, while
    its host may run on.
    """
    if service.forced_down:
        return False
    if ended_at is None:
        return not service.is_up
    return service.last_seen_up is None or service.last_seen_up <= ended_at


async def silent_for(conn: Connection, service_id: int) -> float | None:
    """Seconds since the service's last heartbeat, by the database's clock; ``None`` if
    it never sent one."""
    seconds: float | None = await conn.fetchval(
        """SELECT EXTRACT(EPOCH FROM now() - last_seen_up)::float8 FROM services
            WHERE id = $1""",
        service_id,
    )
    return seconds
