"""When the guests of a compute host are known to be off: the rule every evacuation obeys.

A host whose heartbeat is stale may only be cut off, or only its agent may have died:
guests live in the hypervisor and run on. Rebuilding them elsewhere would run two
copies. keel knows a host's guests are off in two ways only:

* its **fence's lease ran out**: the agent's last heartbeat said the host's fence
  (keel-fence, :mod:`services.fence.guard`) was armed with a lease of L seconds
  (``services.fence_lease``, agents of release
  :data:`~shared.versions.HOST_FENCE_VERSION` and later), and L plus
  ``KEEL_FENCING__MARGIN`` seconds have passed since that heartbeat (by the database's
  clock, :func:`silent_for`). The fence powers every guest off when the lease runs out —
  whether the agent is cut off, hung or dead — and the lease runs from when that
  heartbeat was sent, so from no later than when the database recorded it; the margin is
  the fence's time to look and to power guests off, and clocks that drift;
* an operator **forced it down** (``openstack compute service set --down``) and its last
  heartbeat reported **no** armed fence: the operator's word is then all keel has, as
  in Nova.

A host that was forced down *with* an armed fence is evacuated at once — the move is
accepted and its destination chosen — but the new copy is started only once the
fence's lease has run out too (:attr:`FenceState.seconds_left`): a forced-down never
makes two copies while keel can know better. A host without an armed fence (fencing
off, an older agent, a fence that died) that is merely silent is never evacuated
without an operator. keel-api's ``evacuate``, the conductors' evacuation task and their
automatic evacuation all ask :func:`fence_state`; what a move that ended unfinished may
have left running on its destination asks :func:`stray_copy_may_run`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from shared.db.pool import Connection
from shared.objects.service import Service
from shared.versions import HOST_FENCE_VERSION, release_name

_FORCE_DOWN = (
    "Make sure the host is off, then force its service down (openstack compute service set "
    "--down) and evacuate again."
)


@dataclass(frozen=True)
class FenceState:
    """Whether a compute service's host counts as fenced, and why."""

    host: str
    #: Its servers may be evacuated (the move may be accepted).
    fenced: bool
    #: One sentence for an operator (an API fault, a log line, an instance action).
    why: str
    #: Seconds until the host's guests are certainly off (its fence's lease has run out
    #: by the margin), if waiting is all it takes; a move accepted meanwhile starts its
    #: new copy only then.
    seconds_left: float | None = None
    #: The service is up: nothing is fenced and nothing may be evacuated.
    up: bool = False

    @property
    def guests_off(self) -> bool:
        """Whether a new copy of its servers may start now."""
        return self.fenced and not self.seconds_left


def armed_lease(service: Service) -> float | None:
    """The lease of the host's fence as its last heartbeat reported it; ``None``: none."""
    if service.version < HOST_FENCE_VERSION or not service.fence_lease:
        return None
    return service.fence_lease if service.fence_lease > 0 else None


def lease_left(service: Service, silent_for: float | None, margin: float) -> float | None:
    """Seconds until the host's fence has certainly powered its guests off (≤ 0: it has);
    ``None``: it has no armed fence, or never heartbeated."""
    lease = armed_lease(service)
    if lease is None or silent_for is None:
        return None
    return lease + margin - silent_for


def fence_state(
    service: Service, silent_for: float | None, *, down_time: float, margin: float
) -> FenceState:
    """Whether ``service``'s host is fenced, ``silent_for`` seconds after its last heartbeat
    (``None``: it never sent one); see the module's text. ``down_time`` is kept for the
    callers' sake: a host is down once silent that long."""
    host = service.host
    lease = armed_lease(service)
    left = lease_left(service, silent_for, margin)
    if service.forced_down:
        if left is None or left <= 0:
            why = f"{host} was forced down by an operator"
            if left is not None:
                why += f", and its fence's lease of {lease:g}s ran out"
            return FenceState(host, True, why)
        return FenceState(
            host,
            True,
            f"{host} was forced down by an operator, but its fence's lease of {lease:g}s "
            f"runs out only {math.ceil(left):d}s from now: a new copy of its servers starts "
            "then, not before (its guests may run until their fence powers them off)",
            seconds_left=left,
        )
    if service.is_up:
        return FenceState(host, False, f"Compute service of {host} is still in use.", up=True)
    if lease is None:
        return FenceState(host, False, _no_fence(service, silent_for))
    assert left is not None
    if left <= 0:
        assert silent_for is not None
        return FenceState(
            host,
            True,
            f"{host} is fenced: no heartbeat for {silent_for:.0f}s, past its fence's lease "
            f"of {lease:g}s and the margin ({margin:g}s)",
        )
    return FenceState(
        host,
        False,
        f"Compute service of {host} is down but not yet fenced: its fence powers its servers "
        f"off once its lease of {lease:g}s runs out, and they may be evacuated "
        f"{math.ceil(left):d}s from now (the lease + {margin:g}s margin since its last "
        f"heartbeat, {silent_for:.0f}s ago). Try again then, or force its service down "
        "(the evacuation then waits for the lease).",
        seconds_left=left,
    )


def _no_fence(service: Service, silent_for: float | None) -> str:
    host = service.host
    if silent_for is None:
        return (
            f"Compute service of {host} is down and has never sent a heartbeat: keel cannot "
            f"tell whether its servers run. {_FORCE_DOWN}"
        )
    if service.version < HOST_FENCE_VERSION:
        return (
            f"Compute service of {host} is down, but its agent (release "
            f"{release_name(service.version)}) keeps no host fence: its servers may still "
            f"run. {_FORCE_DOWN}"
        )
    return (
        f"Compute service of {host} is down, and its last heartbeat reported no armed host "
        "fence (fencing switched off with KEEL_FENCING__SELF_FENCE_AFTER=0, or its "
        f"keel-fence not running): its servers may still run. {_FORCE_DOWN}"
    )


def stray_copy_may_run(
    service: Service,
    silent_for: float | None,
    *,
    margin: float,
    ended_at: datetime | None = None,
) -> bool:
    """Whether a copy that a move left on ``service``'s host when it ended unfinished
    (past its deadline) may still be running there.

    Such a copy is explained by no live move: the host's agent stops it when it reports
    its guests, which it does before its first heartbeat and again after any loss of
    contact; the host's fence powers it off once its lease runs out. So it is known to be
    off once the fence's lease has run out, or once the agent has heartbeated since
    ``ended_at`` (with no ``ended_at`` — the move is being ended now — once the agent is
    up, as the caller then tells it what to do with the copy), or, for a host that
    reported no armed fence, once an operator forced it down.
    """
    left = lease_left(service, silent_for, margin)
    if left is not None and left <= 0:
        return False
    if service.forced_down and armed_lease(service) is None:
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
