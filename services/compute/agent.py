"""Start-up and shutdown of keel-compute, in the order DESIGN.md sets.

Start-up (:func:`start_agent`):

1. read every copy of the node identity file (:mod:`services.compute.identity`); a
   corrupt copy, or copies that disagree, stop the agent before anything else;
2. connect to the broker;
3. ask the conductor (read-only, ``resolve_compute``) what the database knows about this
   host and the identity presented; a refusal (a possible rename, a lost or replaced
   identity, a deleted node...) stops the agent with the conductor's message, and a
   conductor too old to answer stops it too; so does a node new to the database whose
   state directory already holds guests. Only then, if the host had no identity
   file, is one written: a fresh UUID for a new host, or the host's node UUID when
   upgrading from a release that kept none;
4. register with the conductor (the agent's only path to the database). Calls to the
   conductor are retried while none answers yet, for at most
   ``settings.rpc.connect_timeout`` seconds; a refusal is never retried;
5. let the driver tidy the host and report its guests to the conductor until it answers
   (:func:`~services.compute.joining.first_reconcile`: evacuated copies go, guests of
   moves under way are kept shut down), then start consuming
   ``compute.<service uuid>``, then start heartbeats: registration does not mark the
   service up, its first heartbeat does, so the scheduler never picks a host whose queue
   does not exist yet or whose guests are not settled.

From the first step to the last the agent holds its host (``agent.lock`` in the state
directory: a second agent on the same state directory is refused) and watches its
contact with the control plane (:mod:`services.compute.contact`); once its node is known
it keeps the host's fence running (:mod:`services.compute.fence_link`), whose lease each
answered heartbeat renews: a host silent for ``KEEL_FENCING__SELF_FENCE_AFTER`` seconds
has its guests powered off by the fence, whether the agent is cut off, hung or dead.
After any loss of contact the agent reconciles its guests again before it starts one.

Shutdown (:meth:`Agent.stop`): stop taking messages, let in-flight operations finish
for up to ``settings.compute.drain_timeout`` seconds, stop heartbeats, disconnect; with
no guest running it releases the fence's lease (the fence exits), else the fence guards
the guests on and powers them off once the lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID

from services.compute import identity
from services.compute.contact import Clock, ContactWatch
from services.compute.fence_link import FenceLink, new_fence_link
from services.compute.joining import (
    fencing_reported,
    first_reconcile,
    legacy_identity,
    register,
    resolve_identity,
)
from services.compute.manager import ComputeManager
from services.compute.reconcile import GuestReconciler
from services.compute.resources import node_resources
from services.compute.rpcapi import topic_for
from services.compute.virt.driver import Driver
from services.conductor.rpcapi import ConductorAPI, Registration
from shared.config import Settings
from shared.context import RequestContext
from shared.exceptions import (
    GuestNotFound,
    HostHeld,
    KeelError,
    MessagingError,
    MessagingTimeout,
    ServiceNotFound,
    ServiceTooOld,
)
from shared.faults import FaultPoints
from shared.metrics import Metrics
from shared.objects.compute_node import NodeResources
from shared.objects.states import PowerState
from shared.rpc import agent_users
from shared.rpc.server import RPCServer
from shared.rpc.settlement import RetryPolicy
from shared.rpc.transport import Transport
from shared.runtime import Lifecycle, repeat
from shared.versions import (
    SERVICE_VERSION,
    STABLE_IDENTITY_VERSION,
    apis_for,
)

LOG = logging.getLogger(__name__)

#: A heartbeat carries the node's resources when they changed since the last heartbeat
#: the conductor answered, and at least every this many heartbeats, so a node row put
#: back from a backup or edited by hand is right again within that (a minute at the
#: default report interval). The others are one statement for the conductor, not five.
RESOURCES_EVERY = 6


class Agent:
    """A running keel-compute: registered, serving its topic, sending heartbeats."""

    def __init__(
        self,
        *,
        settings: Settings,
        transport: Transport,
        conductor: ConductorAPI,
        manager: ComputeManager,
        server: RPCServer,
        driver: Driver,
        registration: Registration,
        service_version: int,
        contact: ContactWatch,
        watchdog: Watchdog,
        on_refused: Callable[[KeelError], None] | None = None,
    ) -> None:
        self.settings = settings
        self.registration = registration
        self.service_version = service_version
        self.manager = manager
        self.contact = contact
        self._watchdog = watchdog
        self._transport = transport
        self._conductor = conductor
        self._server = server
        self._driver = driver
        self._beats = Lifecycle()
        self._on_refused = on_refused
        self._heartbeats: asyncio.Task[None] | None = None
        self._reconciling: asyncio.Task[None] | None = None
        #: The periodic guest report (set once it runs): tests run it at a time they choose.
        self.guest_report: Callable[[], Awaitable[None]] | None = None
        self._stopped = False
        #: The resources of the last heartbeat the conductor answered, and how many
        #: answered heartbeats went without them since.
        self._reported: NodeResources | None = None
        self._beats_without = 0

    @property
    def service_uuid(self) -> UUID:
        return self.registration.service_uuid

    @property
    def topic(self) -> str:
        return self._server.topic

    def start_reconciling(self, reconciler: GuestReconciler) -> None:
        interval = self.settings.compute.reconcile_interval
        report = reconciled_by(reconciler, self.contact, report_limit(self.settings))
        self.contact.attach(report)
        self.guest_report = report
        self._reconciling = asyncio.create_task(
            repeat("guest report", report, interval, self._beats), name="keel-reconcile"
        )

    def start_heartbeats(self) -> None:
        interval = self.settings.report_interval
        self.contact.heartbeats_begin()
        self._heartbeats = asyncio.create_task(
            repeat("heartbeat", self.heartbeat, interval, self._beats), name="keel-heartbeat"
        )
        LOG.info("sending heartbeats every %gs", interval)

    async def heartbeat(self) -> None:
        """Tell the conductor this service is up, with the node's resources if they
        changed (see :data:`RESOURCES_EVERY`)."""
        measured: NodeResources | None
        try:
            measured = await node_resources(self._driver, self.settings.compute)
        except Exception:
            LOG.exception("could not measure resources; sending the heartbeat without them")
            measured = None
        resources = measured
        if measured == self._reported and self._beats_without + 1 < RESOURCES_EVERY:
            resources = None
        sent = self.contact.now()
        # A heartbeat later than the down time is worth nothing: the next one is sent.
        limit = min(self.settings.rpc.call_timeout, self.settings.service_down_time)
        call = self._conductor.service_heartbeat(
            RequestContext.internal(),
            service_uuid=self.service_uuid,
            version=self.service_version,
            node_uuid=self.registration.node_uuid,
            resources=resources,
            self_fence_after=fencing_reported(self.settings, self.service_version),
            fence_lease=self.contact.fence.advertised(),
            timeout=limit,
        )
        try:
            await bounded(call, limit + 1.0, "heartbeat")
            if resources is None:
                self._beats_without += 1
            else:
                self._reported, self._beats_without = resources, 0
            await self.contact.heartbeat_succeeded(sent)
        except ServiceTooOld as exc:
            self._refused(exc)
        except ServiceNotFound:
            # Deleted while this agent was cut off (a live service cannot be deleted).
            self._refused(
                ServiceNotFound(
                    f"compute service {self.service_uuid} of host {self.settings.host!r} was "
                    "deleted by an operator (openstack compute service delete); this agent "
                    "stops. Its node is never used again: to bring the host back as a new "
                    "node, remove its identity file, then start the agent again."
                )
            )

    def _refused(self, exc: KeelError) -> None:
        LOG.error("the conductor refused this agent's heartbeat: %s", exc.message)
        self._beats.stopping.set()
        if self._on_refused is not None:
            self._on_refused(exc)

    async def halt(self) -> None:
        """Stop at once, as a killed process would: no drain, nothing said to the fence
        (its lease runs out by itself); the host's lock is let go, as the kernel would."""
        if self._stopped:
            return
        self._stopped = True
        self._beats.stopping.set()
        for task in (self._heartbeats, self._reconciling):
            if task is not None:
                task.cancel()
        await self._watchdog.stop()
        self.contact.fence.stop()
        self.contact.fence.store.drop_agent()

    async def stop(self) -> None:
        """Stop consuming, drain in-flight work (bounded), stop heartbeats, disconnect."""
        if self._stopped:
            return
        self._stopped = True
        drain = self.settings.compute.drain_timeout
        pending = self.manager.in_flight()
        if pending:
            LOG.info(
                "stopping: waiting up to %gs for %d operation(s) in progress: %s",
                drain,
                len(pending),
                ", ".join(f"{op} of {uuid}" for uuid, op in pending.items()),
            )
        else:
            LOG.info("stopping: no operation in progress")
        try:
            await self._server.stop(drain)
        finally:
            self._beats.stopping.set()
            await self._watchdog.stop()
            for task in (self._heartbeats, self._reconciling):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self._transport.close()
            await self._let_go()
        LOG.info("compute service %s stopped", self.service_uuid)

    async def _let_go(self) -> None:
        """Leave the host to its fence: released if no guest runs, guarded otherwise."""
        fence = self.contact.fence
        try:
            running = await any_running(self._driver)
            await fence.release(guests_running=running)
        except Exception:
            LOG.exception("could not tell the host's fence that this agent stops")
            running = True
        finally:
            fence.stop()
            fence.store.drop_agent()
        if fence.enabled and running:
            LOG.info(
                "guests still run: the host's fence guards them and powers them off %gs "
                "after the last answered heartbeat unless an agent is back by then",
                fence.length,
            )


T = TypeVar("T")


async def bounded(call: Awaitable[T], seconds: float, what: str) -> T:
    """Await ``call`` for at most ``seconds``, even if it ignores its cancellation.

    A call begun while the broker connection was being lost must never stop heartbeats
    for good: one that outlives its own timeout is cancelled and left to finish on its
    own, and one the transport cancelled from inside is a failure like any other.
    """
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise MessagingTimeout(f"the {what} did not end within {seconds:g}s; abandoned")
    if task.cancelled():
        # Not by this task: the transport cancelled what the call waited for.
        raise MessagingError(f"the {what} was cancelled: the broker connection was lost")
    return task.result()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class Watchdog:
    """The agent's :class:`ContactWatch` watching, in a task, from start-up to shutdown."""

    def __init__(self, contact: ContactWatch) -> None:
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(contact.run(self._stopping), name="keel-contact")

    async def stop(self) -> None:
        self._stopping.set()
        await self._task


def report_limit(settings: Settings) -> float:
    """Seconds a guest report may take: its calls, and what the agent does meanwhile."""
    return 3 * settings.rpc.call_timeout


def warn_if_failover_outlasts_the_lease(settings: Settings) -> None:
    """Say so if losing the broker node could outlast half the fence's lease."""
    lease, failover = settings.self_fence_after, settings.broker_failover()
    if lease > 0 and failover > lease / 2:
        LOG.warning(
            "if this agent's RabbitMQ node froze, it could go %.0fs without an answered "
            "heartbeat before it is on another node: more than half its fence's lease "
            "(KEEL_FENCING__SELF_FENCE_AFTER=%g), so its host could be fenced for nothing. "
            "Lower KEEL_RPC__HEARTBEAT (or the URL's ?heartbeat=) or lengthen the lease",
            failover,
            lease,
            extra={"decision": "failover_outlasts_lease"},
        )


def new_contact_watch(
    settings: Settings, fence: FenceLink, clock: Clock, *, self_ticking: bool = True
) -> ContactWatch:
    """The agent's contact watch: contact lost after two report intervals."""
    return ContactWatch(
        fence, lost_after=2 * settings.report_interval, clock=clock, self_ticking=self_ticking
    )


async def any_running(driver: Driver) -> bool:
    """Whether a guest of this host runs (what a stopping agent leaves its fence)."""
    for guest in await driver.list_instances():
        try:
            if await driver.guest_power(guest) is PowerState.RUNNING:
                return True
        except GuestNotFound:
            continue
    return False


def reconciled_by(
    reconciler: GuestReconciler, contact: ContactWatch, limit: float
) -> Callable[[], Awaitable[None]]:
    """A guest report, abandoned after ``limit`` seconds, that tells ``contact`` when it
    was answered and acted on."""

    async def report() -> None:
        started = contact.now()
        await bounded(reconciler.reconcile(), limit, "guest report")
        await contact.reconciled(started)

    return report


async def start_agent(
    settings: Settings,
    transport: Transport,
    driver: Driver,
    *,
    service_version: int = SERVICE_VERSION,
    on_refused: Callable[[KeelError], None] | None = None,
    metrics: Metrics | None = None,
    fence: FenceLink | None = None,
    clock: Clock = time.monotonic,
    self_ticking: bool = True,
) -> Agent:
    """Start keel-compute on ``transport`` (not yet connected; the agent owns it).

    ``service_version`` below the current one makes the agent behave as that older
    release: it reports that version and serves only that release's compute RPC version.
    ``fence``: the host's fence (by default, what the settings and the driver call for);
    ``clock``: the monotonic clock its lease is counted on; ``self_ticking`` False: the
    contact watch looks only when the caller says (a test that keeps time itself).
    Raises the :class:`~shared.exceptions.KeelError` that stops start-up, after
    disconnecting.
    """
    apis_for(service_version)  # an unknown release fails here, before anything is held
    found = await asyncio.to_thread(
        identity.read_identity, settings.state_dir, settings.config_file
    )
    fence = fence or new_fence_link(settings, driver, metrics)
    warn_if_failover_outlasts_the_lease(settings)
    if not await asyncio.to_thread(fence.store.hold_agent):
        raise HostHeld(
            f"another keel-compute runs with the state directory {settings.state_dir} "
            "(it holds agent.lock there); stop it first, or give this one a state "
            "directory of its own"
        )
    try:
        return await _start_holding(
            settings,
            transport,
            driver,
            found=found,
            fence=fence,
            clock=clock,
            service_version=service_version,
            metrics=metrics,
            on_refused=on_refused,
            self_ticking=self_ticking,
        )
    except BaseException:
        fence.stop()
        fence.store.drop_agent()
        raise


async def _start_holding(
    settings: Settings,
    transport: Transport,
    driver: Driver,
    *,
    found: identity.NodeIdentity,
    fence: FenceLink,
    clock: Clock,
    service_version: int,
    metrics: Metrics | None,
    on_refused: Callable[[KeelError], None] | None,
    self_ticking: bool,
) -> Agent:
    """Start-up once the host is held (see :func:`start_agent`)."""
    apis = apis_for(service_version)
    contact = new_contact_watch(settings, fence, clock, self_ticking=self_ticking)
    transport.on_connection_lost(
        lambda reason: contact.contact_lost(f"the broker connection was lost ({reason})")
    )
    watchdog = Watchdog(contact)
    try:
        await transport.connect()
    except BaseException:
        await watchdog.stop()
        raise
    try:
        conductor = ConductorAPI(
            transport, version_cap=apis.conductor, timeout=settings.rpc.call_timeout
        )
        resources = await node_resources(driver, settings.compute)
        if service_version >= STABLE_IDENTITY_VERSION:
            node_uuid = await resolve_identity(
                conductor, settings, found, resources.hypervisor_hostname
            )
        else:
            node_uuid = await legacy_identity(settings, found)
        registration = await register(conductor, settings, node_uuid, service_version, resources)
        await driver.init_host(registration.node_uuid)
        fence.begin()
        manager = ComputeManager(
            driver,
            conductor,
            node_uuid=registration.node_uuid,
            faults=FaultPoints(settings.fault_inject),
            gate=contact,
            live_migration_seconds=settings.compute.live_migration_seconds,
        )
        reconciler = GuestReconciler(driver, conductor, manager, registration.node_uuid)
        await first_reconcile(reconciled_by(reconciler, contact, report_limit(settings)))
        server = RPCServer(
            transport,
            topic_for(registration.service_uuid),
            manager,
            version=apis.compute,
            policy=RetryPolicy.from_settings(settings.rpc),
            metrics=metrics,
            guard=agent_users.refuse_agents,
        )
        await server.start(prefetch=settings.rpc.prefetch)
    except BaseException:
        await watchdog.stop()
        await transport.close()
        raise
    agent = Agent(
        settings=settings,
        transport=transport,
        conductor=conductor,
        manager=manager,
        server=server,
        driver=driver,
        registration=registration,
        service_version=service_version,
        contact=contact,
        watchdog=watchdog,
        on_refused=on_refused,
    )
    agent.start_heartbeats()
    agent.start_reconciling(reconciler)
    return agent
