"""How an agent joins the control plane: its identity resolved, registered, its guests
settled before it serves.

The steps of :func:`services.compute.agent.start_agent` that talk to the conductor
before the agent consumes its queue: :func:`resolve_identity` (what the database knows
of this host, before an identity file is written), :func:`register`, and
:func:`first_reconcile` (the first guest report, answered before anything is served).
Calls are retried while no conductor answers yet (:func:`until_answered`, bounded); a
refusal is never retried.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar
from uuid import UUID

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception_type,
    stop_before_delay,
    wait_random_exponential,
)

from services.compute import identity
from services.conductor.rpcapi import ComputeResolution, ConductorAPI, Registration
from shared.config import Settings
from shared.context import RequestContext
from shared.exceptions import (
    MessagingTimeout,
    NoSuchMethod,
    ServiceTooOld,
    TransientError,
    Unroutable,
    UnsupportedVersion,
)
from shared.objects.compute_node import NodeResources
from shared.versions import SELF_FENCING_VERSION

LOG = logging.getLogger(__name__)
T = TypeVar("T")

#: Errors that mean "no conductor is answering yet", as opposed to a refusal.
_NOT_ANSWERING = (Unroutable, MessagingTimeout, TransientError)


def fencing_reported(settings: Settings, service_version: int) -> float | None:
    """The self-fencing setting the agent reports; ``None`` for a release before it."""
    if service_version < SELF_FENCING_VERSION:
        return None
    return settings.self_fence_after


async def until_answered(settings: Settings, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """Run ``call``, retrying while no conductor answers (bounded by the connect timeout)."""
    within = settings.rpc.connect_timeout

    def log_retry(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        elapsed = state.seconds_since_start or 0.0
        LOG.warning(
            "no conductor answered %s attempt %d (%s); retrying in %.1fs, giving up in %.0fs",
            what,
            state.attempt_number,
            error,
            state.upcoming_sleep,
            max(within - elapsed, 0.0),
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(_NOT_ANSWERING),
        stop=stop_before_delay(within),
        wait=wait_random_exponential(multiplier=0.2, max=5.0),
        before_sleep=log_retry,
    )
    try:
        result: T = await retrying(call)
    except RetryError as exc:
        raise MessagingTimeout(
            f"no keel-conductor answered the {what} of host {settings.host!r} within "
            f"{within:g}s (last error: {exc.last_attempt.exception()}); check that "
            f"keel-conductor is running and uses exchange {settings.exchange!r}"
        ) from None
    return result


def _conductor_too_old(detail: str) -> ServiceTooOld:
    return ServiceTooOld(
        f"keel-conductor cannot resolve this agent's node identity ({detail}): it runs an "
        "older release than this agent. Nothing was changed. Upgrade every keel-conductor "
        "first (agents last), then start this agent again."
    )


async def resolve_identity(
    conductor: ConductorAPI,
    settings: Settings,
    found: identity.NodeIdentity,
    hypervisor_hostname: str,
) -> UUID:
    """Ask the conductor about this host, then settle the node UUID (writing it if new)."""

    async def ask() -> ComputeResolution | None:
        return await conductor.resolve_compute(
            RequestContext.internal(),
            host=settings.host,
            node_uuid=found.node_uuid,
            hypervisor_hostname=hypervisor_hostname,
            identity_file=found.describe(),
        )

    try:
        resolution = await until_answered(settings, "identity check", ask)
    except (UnsupportedVersion, NoSuchMethod) as exc:
        raise _conductor_too_old(exc.message) from None
    if resolution is None:
        raise _conductor_too_old(f"its RPC API is capped at {conductor.client.version_cap}")
    LOG.info(
        "node identity of host %s: %s (%s)",
        settings.host,
        resolution.decision,
        resolution.reason,
        extra={"decision": f"identity_{resolution.decision}"},
    )
    if resolution.decision == "new":
        guests = await asyncio.to_thread(identity.guests_in, settings.state_dir)
        identity.refuse_new_node_holding(settings.host, settings.state_dir, guests)
    if found.node_uuid is not None:
        LOG.info("node identity %s read from %s", found.node_uuid, found.describe())
        return found.node_uuid
    node_uuid = resolution.node_uuid or uuid.uuid4()
    return await asyncio.to_thread(identity.create_identity, settings.state_dir, node_uuid)


async def legacy_identity(settings: Settings, found: identity.NodeIdentity) -> UUID:
    """An agent behaving as a release before stable identities: create, then register."""
    if found.node_uuid is not None:
        return found.node_uuid
    return await asyncio.to_thread(identity.create_identity, settings.state_dir, uuid.uuid4())


async def register(
    conductor: ConductorAPI,
    settings: Settings,
    node_uuid: UUID,
    service_version: int,
    resources: NodeResources,
) -> Registration:
    """Register with the conductor, retrying while none answers (bounded)."""

    async def call() -> Registration:
        return await conductor.register_compute(
            RequestContext.internal(),
            host=settings.host,
            node_uuid=node_uuid,
            version=service_version,
            resources=resources,
            self_fence_after=fencing_reported(settings, service_version),
        )

    registration = await until_answered(settings, "registration", call)
    LOG.info(
        "registered as compute service %s (node %s, id %d) at service version %d",
        registration.service_uuid,
        registration.node_uuid,
        registration.node_id,
        service_version,
    )
    return registration


async def first_reconcile(report: Callable[[], Awaitable[None]]) -> None:
    """Settle the guests on this host before serving: evacuated copies go, others wait.

    Until the conductor has answered one guest report, the agent neither consumes its
    queue (no build, no power action) nor heartbeats (it is not reported up by itself):
    a host that was cut off or down must first learn which of its guests were evacuated.
    While no conductor answers it retries with growing pauses (up to
    :data:`RECONCILE_MAX_PAUSE` seconds), saying each time what it waits for.
    """
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(_NOT_ANSWERING),
        wait=wait_random_exponential(multiplier=0.5, max=RECONCILE_MAX_PAUSE),
        before_sleep=_log_reconcile_retry,
    )
    await retrying(report)


#: Longest pause between two attempts of the first guest report.
RECONCILE_MAX_PAUSE = 30.0


def _log_reconcile_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    LOG.warning(
        "waiting for keel-conductor to answer this host's first guest report (attempt %d: "
        "%s); not serving and not reporting up until it does; retrying in %.1fs",
        state.attempt_number,
        error,
        state.upcoming_sleep,
        extra={"decision": "reconcile_waiting"},
    )
