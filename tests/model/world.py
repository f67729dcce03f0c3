"""The control plane of the model in one process: real keel code, real PostgreSQL.

:class:`World` owns, for one test, a scratch database (migrated by the tests' database
fixture) and, for each example, a fresh cloud on it: keel-conductor and keel-scheduler
(their real ``run_*`` functions), keel-api (the real application, driven over
``httpx.ASGITransport``) and three compute agents (the real ``start_agent``) on hosts
whose fake hypervisors keep their guests across agent kills. All talk over the fake
broker, which holds every cast until the model delivers it (calls are answered at once).

Between examples the database is put back as it was after set-up: every table emptied
and refilled from a copy taken then (``model_snapshot`` schema), a few milliseconds.

**Time.** Every deadline keel keeps (the build deadline, the service down time, the
confirm window, stalled endings, move and task deadlines) is computed by PostgreSQL from
``now()`` and a timestamp stored in a row; none uses a process's clock. So the model
advances time by moving every stored timestamp back (:meth:`World.advance`): one
``UPDATE`` per table, the same shift for every row, so every age grows by the same
amount and nothing else changes — no production code needs a clock parameter, and
whatever sweeper exists runs unchanged. The processes' own monotonic clocks only time
RPC calls, which the broker expires explicitly (:meth:`FakeBroker.expire_calls`).

**The hosts' own clock.** A compute host counts time on its monotonic clock, not the
database's: its fence's lease, its agent's sense of contact. The model's hosts share
:meth:`World.clock` — the process's monotonic clock plus every second the model let
pass — so :meth:`World.advance` moves both clocks alike, and wakes every fence
(:mod:`tests.model.fences`) to look at its lease then.

**Transitions.** Triggers (installed here, not by keel's schema) write every change of
an instance's ``(vm_state, task_state, node)`` and of a migration's status to
``model_transitions`` in the transaction that makes it, so invariant I5 sees every
committed transition, not only the states between two steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import asyncpg
import httpx

from services.api.app import create_app
from services.compute import manager as manager_module
from services.compute.agent import Agent, start_agent
from services.compute.fence_link import FenceLink
from services.compute.rpcapi import ComputeAPI
from services.conductor.main import run_conductor
from services.conductor.rpcapi import ConductorAPI
from services.fence.api import MemoryLeaseStore
from services.scheduler.main import run_scheduler
from shared.config import (
    AuthSettings,
    ComputeSettings,
    ImageSettings,
    NetworkSettings,
    RpcSettings,
    Settings,
    TokenInfo,
)
from shared.db import fixed_ips, flavors, images
from shared.exceptions import KeelError
from shared.metrics import Metrics
from shared.runtime import Lifecycle
from shared.version_pins import Pins
from shared.versions import HOST_FENCE_VERSION, SERVICE_VERSION
from tests.model import sweeps
from tests.model.fences import ModelLauncher, wake_fences
from tests.model.hosts import Host
from tests.model.runtime import Process, Runtime

LOG = logging.getLogger(__name__)

HOSTS = 3
IMAGE_ID = UUID("0b5e5a1e-0000-4000-8000-00000000cafe")
#: A flavor servers may be resized to (besides m1.tiny, "1"): two fit on a host.
BIG_FLAVOR = "model.big"
ADMIN_TOKEN = "model-admin"
#: Seconds without a heartbeat before a service is down (keel's default).
DOWN_TIME = 60.0
BUILD_TIMEOUT = 600.0
CONFIRM_WINDOW = 1800.0
#: With soft delete on (the search), a DELETE keeps an ACTIVE or SHUTOFF server
#: SOFT_DELETED this long (the restore and forceDelete rules act on it); settling passes it.
RECLAIM_INTERVAL = 1200.0
CALL_TIMEOUT = 60.0
#: Advancing by this much passes every deadline keel has (the longest is a move's hour).
PAST_EVERY_DEADLINE = 4000.0
#: Seconds after which a silent host's fence lease (twice the down time) has run out by
#: the margin (30 s, the default): a held evacuation goes on then.
LEASE_RUNS_OUT = 2 * DOWN_TIME + 30.0 + 1.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS model_transitions (
    id       BIGSERIAL PRIMARY KEY,
    tx       BIGINT NOT NULL DEFAULT txid_current(),
    kind     TEXT NOT NULL,
    subject  UUID NOT NULL,
    old_vm   TEXT, old_task TEXT, old_node BIGINT, old_deleted BOOLEAN,
    new_vm   TEXT, new_task TEXT, new_node BIGINT, new_deleted BOOLEAN,
    mtype    TEXT, old_status TEXT, new_status TEXT
);
CREATE OR REPLACE FUNCTION model_instance_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO model_transitions (kind, subject, new_vm, new_task, new_node, new_deleted)
        VALUES ('instance', NEW.uuid, NEW.vm_state, NEW.task_state, NEW.compute_id,
                NEW.deleted_at IS NOT NULL);
    ELSIF (OLD.vm_state, OLD.task_state, OLD.compute_id, OLD.deleted_at IS NULL)
          IS DISTINCT FROM (NEW.vm_state, NEW.task_state, NEW.compute_id, NEW.deleted_at IS NULL)
    THEN
        INSERT INTO model_transitions (kind, subject, old_vm, old_task, old_node, old_deleted,
                                       new_vm, new_task, new_node, new_deleted)
        VALUES ('instance', NEW.uuid, OLD.vm_state, OLD.task_state, OLD.compute_id,
                OLD.deleted_at IS NOT NULL, NEW.vm_state, NEW.task_state, NEW.compute_id,
                NEW.deleted_at IS NOT NULL);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE FUNCTION model_migration_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status THEN
        INSERT INTO model_transitions (kind, subject, mtype, old_status, new_status)
        VALUES ('migration', NEW.uuid, NEW.migration_type,
                CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.status END, NEW.status);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS model_instance_changed ON instances;
CREATE TRIGGER model_instance_changed AFTER INSERT OR UPDATE ON instances
    FOR EACH ROW EXECUTE FUNCTION model_instance_changed();
DROP TRIGGER IF EXISTS model_migration_changed ON migrations;
CREATE TRIGGER model_migration_changed AFTER INSERT OR UPDATE ON migrations
    FOR EACH ROW EXECUTE FUNCTION model_migration_changed();
"""


def base_settings(
    database_url: str, workdir: Path, *, call_timeout: float = CALL_TIMEOUT
) -> Settings:
    return Settings(
        database_url=database_url,
        exchange="model",
        host="control",
        state_dir=workdir / "control",
        # The model sends heartbeats and guest reports itself: within an example (a few
        # seconds) these timers never fire.
        report_interval=50.0,
        service_down_time=DOWN_TIME,
        build_timeout=BUILD_TIMEOUT,
        resize_confirm_window=CONFIRM_WINDOW,
        log_level="WARNING",
        rpc=RpcSettings(
            call_timeout=call_timeout,
            connect_timeout=0.2,
            handler_retry_timeout=0.05,
            delivery_limit=5,
        ),
        compute=ComputeSettings(
            driver="fake", reconcile_interval=1e6, drain_timeout=1.0, live_migration_seconds=0.0
        ),
        auth=AuthSettings(
            tokens={ADMIN_TOKEN: TokenInfo(user_id="root", project_id="ops", roles=["admin"])}
        ),
        network=NetworkSettings(cidr="10.20.0.0/24"),
        # Snapshots and shelves need signed URLs; nothing listens where they point (port
        # 9, discard): the agents' uploads are taken by World.upload instead.
        images=ImageSettings(
            url_secret="model-image-url-secret",
            download_url="http://127.0.0.1:9",
            store_dir=workdir / "image-store",
        ),
    )


class World:
    """A whole cloud in one event loop; one per test, reset for each example."""

    def __init__(
        self, db: asyncpg.Pool, settings: Settings, workdir: Path, runtime: Runtime | None = None
    ) -> None:
        self.db = db
        self.settings = settings
        self.workdir = workdir
        #: The in-memory broker's runtime, or another (RabbitMQ's: tests/model/amqp.py).
        self.rt = runtime or Runtime(db)
        self.api = Process(self.rt, "keel-api")
        self.conductor = Process(self.rt, "keel-conductor")
        self.scheduler = Process(self.rt, "keel-scheduler")
        self.hosts: list[Host] = []
        self.agents: dict[int, Process] = {}
        #: Each host's keel-fence (:mod:`tests.model.fences`).
        self.fences: dict[int, Process] = {}
        #: Seconds the model let pass (the hosts' clocks run that far ahead).
        self._offset = 0.0
        self.agent_objects: dict[int, Agent] = {}
        #: Every agent's service UUID ever registered (their queues, to remove at the end).
        self.agent_services: set[UUID] = set()
        #: Why each host's last agent start was refused (host index → message).
        self.refusals: dict[int, str] = {}
        self.http: httpx.AsyncClient | None = None
        #: Destroys of copies keel still needed (invariant I3), as found when they happened.
        self.i3_violations: list[str] = []
        self.on_destroy: Callable[[Host, UUID, UUID | None], Awaitable[None]] | None = None
        self._stops: list[Callable[[], Awaitable[None]]] = []
        self._reset_sql = ""
        self._state_files: dict[Path, bytes] = {}
        self._registered: dict[int, UUID | None] = {}
        self._app: Any = None
        #: The scheduler's choices among equal hosts: reseeded at each step (see seed()).
        self.rng = random.Random(0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._real_upload = getattr(manager_module, "upload")  # noqa: B009

    # -- the agents' uploads -----------------------------------------------------------

    async def _upload_arrives(self, image_id: UUID, size: int) -> bool:
        async with self.db.acquire() as conn:
            found = await conn.fetchval(
                """UPDATE images SET status = 'active', size = $2, updated_at = now()
                    WHERE id = $1 AND deleted_at IS NULL AND status IN ('queued', 'saving')
                RETURNING id""",
                image_id,
                size,
            )
        return found is not None

    def upload(self, url: str, path: Path, *, timeout: float = 0.0) -> int:
        """What keel-api does with an agent's upload of a snapshot's or a shelve's data,
        done here (the model's agents reach no keel-api over HTTP): the image is made
        active, or the upload refused as keel-api refuses one for an image that has its
        data already or is gone. Runs in the agent's worker thread, as the real upload."""
        assert self._loop is not None
        image_id = UUID(urlsplit(url).path.rsplit("/", 1)[-1])
        size = path.stat().st_size
        taken = asyncio.run_coroutine_threadsafe(self._upload_arrives(image_id, size), self._loop)
        if not taken.result():
            raise KeelError(
                f"keel-api refused the data of image {image_id} (409): it has its data "
                "already, or is gone"
            )
        return size

    # -- once per test -----------------------------------------------------------------

    async def prepare(self) -> None:
        """Seed, install the triggers, start the cloud once, then take the copy.

        The copy holds the registered services and nodes, and each host's state
        directory (its identity file), so an example starts every process on them
        without registering anything anew.
        """
        self._loop = asyncio.get_running_loop()
        setattr(manager_module, "upload", self.upload)  # noqa: B010
        async with self.db.acquire() as conn:
            await fixed_ips.ensure_network(conn, self.settings.network)
            await images.create(conn, image_id=IMAGE_ID, name="model-image")
            await flavors.create(
                conn, flavorid=BIG_FLAVOR, name=BIG_FLAVOR, vcpus=2, memory_mb=768, root_gb=1
            )
            await conn.execute(SCHEMA)
        self.hosts = [self._new_host(index) for index in range(HOSTS)]
        await self._start_processes()
        await self.stop()
        async with self.db.acquire() as conn:
            tables = [
                r["tablename"]
                for r in await conn.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
                )
                if r["tablename"] != "model_transitions"
            ]
            await conn.execute("DROP SCHEMA IF EXISTS model_snapshot CASCADE")
            await conn.execute("CREATE SCHEMA model_snapshot")
            for table in tables:
                await conn.execute(
                    f'CREATE TABLE model_snapshot."{table}" AS SELECT * FROM public."{table}"'
                )
            columns = await conn.fetch(
                """SELECT table_name, string_agg(format('%I = %I - model_by', column_name,
                                                       column_name), ', ') AS sets
                     FROM information_schema.columns
                    WHERE table_schema = 'public' AND data_type = 'timestamp with time zone'
                      AND table_name <> 'model_transitions'
                    GROUP BY table_name ORDER BY table_name"""
            )
            # One function (its statements planned once a session), called in one
            # statement: every table moves in the same transaction.
            shifts = " ".join(f'UPDATE "{r["table_name"]}" SET {r["sets"]};' for r in columns)
            await conn.execute(
                "CREATE OR REPLACE FUNCTION model_shift(model_by interval) RETURNS void "
                f"LANGUAGE plpgsql AS $$ BEGIN {shifts} END $$"
            )
        restore = [f'DELETE FROM public."{t}";' for t in tables]
        restore += [f'INSERT INTO public."{t}" SELECT * FROM model_snapshot."{t}";' for t in tables]
        self._reset_sql = (
            "SET session_replication_role = replica; TRUNCATE model_transitions; "
            + " ".join(restore)
            + " SET session_replication_role = DEFAULT;"
            # The copy's heartbeats are as old as the copy: every service beat just now.
            + " UPDATE services SET last_seen_up = now();"
        )
        self._state_files = {
            path: path.read_bytes()
            for host in self.hosts
            for path in host.state_dir.rglob("*")
            if path.is_file()
        }
        self._registered = {host.index: host.node_uuid for host in self.hosts}

    def _new_host(self, index: int) -> Host:
        state_dir = self.workdir / f"host{index}"
        state_dir.mkdir(parents=True, exist_ok=True)
        host = Host(index, f"host{index}", state_dir, f"node{index}")
        host.attach(self._destroying, self.clock)
        return host

    def clock(self) -> float:
        """The hosts' monotonic clock (see the module's text)."""
        return time.monotonic() + self._offset

    # -- each example ------------------------------------------------------------------

    async def start(self, *, agent_release: int = SERVICE_VERSION) -> None:
        """A fresh cloud: database and state directories as copied, every process up.

        ``agent_release``: the release every agent runs (one before this one: a rolling
        upgrade under way, its control plane upgraded, its agents not yet)."""
        self.seed(0)
        await self.rt.reset()
        self.fences.clear()
        self.i3_violations.clear()
        self.refusals.clear()
        async with self.db.acquire() as conn:
            await conn.execute(self._reset_sql)
            await conn.execute(
                """UPDATE services SET version = $1 WHERE "binary" = 'keel-compute'""",
                agent_release,
            )
        self.hosts = [self._new_host(index) for index in range(HOSTS)]
        for host in self.hosts:
            host.node_uuid = self._registered[host.index]
            for path in list(host.state_dir.rglob("*")):
                if path.is_file() and path not in self._state_files:
                    path.unlink()
        for path, content in self._state_files.items():
            if not path.exists() or path.read_bytes() != content:
                path.write_bytes(content)
        await self._start_processes(together=True, agent_release=agent_release)
        # The next heartbeat of each agent, one report interval later on a host: its fence
        # is armed by then (its first heartbeat's answer gave it a lease), and it says so.
        for host in self.hosts:
            self.heartbeat(host)
        await self.rt.idle()

    async def _start_processes(
        self, *, together: bool = False, agent_release: int = SERVICE_VERSION
    ) -> None:
        """Start every process; ``together``: at once (their rows exist: nothing is decided
        by which registers first)."""
        if together:
            await asyncio.gather(
                self.start_conductor(settle=False), self.start_scheduler(settle=False)
            )
            await self.start_api()
            await self.rt.idle()
            await asyncio.gather(
                *(
                    self.start_agent(host, settle=False, release=agent_release)
                    for host in self.hosts
                )
            )
        else:
            await self.start_conductor()
            await self.start_scheduler()
            await self.start_api()
            for host in self.hosts:
                await self.start_agent(host)
        await self.rt.idle()

    async def stop(self) -> None:
        """Kill everything that runs (nothing drains: the next example starts afresh)."""
        processes = [
            self.api,
            self.conductor,
            self.scheduler,
            *self.agents.values(),
            *self.fences.values(),
        ]
        for process in processes:
            self.rt.kill(process)
        tasks = [t for p in processes for t in p.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stop in self._stops:
            with contextlib.suppress(Exception):
                await stop()
        self._stops.clear()
        await asyncio.sleep(0)

    async def close(self) -> None:
        setattr(manager_module, "upload", self._real_upload)  # noqa: B010
        await self.stop()
        if self.http is not None:
            await self.http.aclose()
            self.http = None

    def seed(self, step: int) -> None:
        """Every random choice of the next step follows from ``step``, whatever came before."""
        random.seed(step)
        self.rng.seed(step)

    # -- processes ---------------------------------------------------------------------

    def _service_settings(self, host: str) -> Settings:
        return self.settings.model_copy(update={"host": host})

    async def _start_main(
        self,
        process: Process,
        main: Callable[[Settings, Lifecycle, asyncpg.Pool, Any], Coroutine[Any, Any, None]],
        *,
        settle: bool = True,
    ) -> None:
        await process.connect()
        lifecycle = Lifecycle(metrics=Metrics())

        async def end() -> None:
            lifecycle.stopping.set()

        process.on_kill = end
        task = process.spawn(
            main(self._service_settings("control"), lifecycle, process.db, process.rpc), "main"
        )

        def exited(done: asyncio.Task[None]) -> None:
            # A main that ends by itself is a process that exits: its supervisor starts
            # it again (the settling does).
            if done.cancelled() or not process.alive:
                return
            LOG.warning("%s exited: %r", process.name, done.exception())
            self.rt.kill(process)

        task.add_done_callback(exited)
        if settle:
            await self.rt.idle()

    async def start_conductor(self, *, settle: bool = True) -> None:
        await self._start_main(self.conductor, run_conductor, settle=settle)

    async def start_scheduler(self, *, settle: bool = True) -> None:
        await self._start_main(self.scheduler, partial(run_scheduler, rng=self.rng), settle=settle)

    async def start_api(self) -> None:
        """keel-api on a new transport (the application is built once: it keeps no state)."""
        await self.api.connect()
        transport = self.api.rpc
        settings = self._service_settings("control")
        pins = Pins.build(self.api.db, settings, Metrics())
        timeout = settings.rpc.call_timeout
        conductor = ConductorAPI(transport, timeout=timeout, version_cap=pins.conductor.cap)
        compute = ComputeAPI(transport, timeout=timeout, version_cap=pins.compute.cap)
        if self._app is None:
            self._app = create_app(settings, self.api.db, conductor, compute)
        self._app.state.conductor = conductor
        self._app.state.compute = compute
        if self.http is None:
            self.http = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=self._app),
                base_url="http://keel.model",
                headers={"X-Auth-Token": ADMIN_TOKEN},
            )

    def agent_settings(self, host: Host) -> Settings:
        compute = self.settings.compute.model_copy(update={"hypervisor_hostname": host.hypervisor})
        return self.settings.model_copy(
            update={"host": host.name, "state_dir": host.state_dir, "compute": compute}
        )

    async def start_agent(
        self, host: Host, *, settle: bool = True, release: int = SERVICE_VERSION
    ) -> bool:
        """Start keel-compute on ``host``; False (and why in ``refusals``) if it refused.

        ``settle``: run the world until idle afterwards (never while another waits so);
        ``release``: the release the agent behaves as (an upgrade under way)."""
        process = self.agents.get(host.index)
        if process is not None and process.alive:
            return True
        if not self.conductor.alive:
            # An agent waits for a conductor to answer its first guest report for as long
            # as it takes: the model starts agents only when one can answer.
            return False
        process = Process(self.rt, f"keel-compute@{host.name}")
        self.agents[host.index] = process
        if not host.powered:
            host.reboot()
        host.powered = True
        transport = await process.connect(now=False)

        def refused(exc: KeelError) -> None:
            self.refusals[host.index] = exc.message
            self.rt.kill(process)

        try:
            settings = self.agent_settings(host)
            if release >= HOST_FENCE_VERSION:
                fence = FenceLink(
                    host.lease, ModelLauncher(self, host), length=settings.self_fence_after
                )
            else:
                # The releases before host fences keep none: no fence, no lease.
                fence = FenceLink(MemoryLeaseStore(), None, length=0)
            agent = await start_agent(
                settings,
                process.rpc,
                host.driver,
                on_refused=refused,
                service_version=release,
                fence=fence,
                clock=self.clock,
                self_ticking=False,
            )
        except (KeelError, asyncpg.PostgresError) as exc:
            self.refusals[host.index] = str(exc)
            process.alive = False
            transport.kill()
            if settle:
                await self.rt.idle()
            return False
        self.refusals.pop(host.index, None)
        self.agent_objects[host.index] = agent
        self.agent_services.add(agent.registration.service_uuid)
        host.node_uuid = agent.registration.node_uuid

        async def stop_agent() -> None:
            with contextlib.suppress(Exception):
                await agent.halt()

        process.on_kill = stop_agent
        if settle:
            await self.rt.idle()
        return process.alive

    def agent(self, host: Host) -> Process | None:
        process = self.agents.get(host.index)
        return process if process is not None and process.alive else None

    def crash(self, host: Host) -> None:
        """The host loses power: its agent and its fence die and its guests stop (their
        disks stay)."""
        for process in (self.agents.get(host.index), self.fences.get(host.index)):
            if process is not None:
                self.rt.kill(process)
        host.powered = False
        host.driver.power_loss()

    # -- the model's own periodic work --------------------------------------------------

    def heartbeat(self, host: Host) -> None:
        process = self.agent(host)
        if process is not None:
            self.rt.start(process, "heartbeat", self.agent_objects[host.index].heartbeat)

    def watch(self, host: Host) -> None:
        """The agent's contact watch looks once (what its timer does on a host)."""
        process = self.agent(host)
        if process is not None:
            contact = self.agent_objects[host.index].contact
            self.rt.start(process, f"contact watch of {host.name}", contact.tick)

    def reconcile(self, host: Host, **plan: Any) -> None:
        process = self.agent(host)
        if process is not None:
            report = self.agent_objects[host.index].guest_report
            assert report is not None
            self.rt.start(process, f"guest report of {host.name}", report, **plan)

    def sweep(self, **plan: Any) -> None:
        """Run the conductor's deadline sweep once (builds, moves, tasks...)."""
        if not self.conductor.alive or self.conductor.transport is None:
            return
        for name, job in sweeps.conductor_jobs(
            self._service_settings("control"), self.conductor.db, self.conductor.rpc
        ):
            self.rt.start(self.conductor, name, job, **plan)

    async def control_heartbeats(self) -> None:
        """The conductor's and scheduler's own heartbeats (their timers never fire)."""
        alive = [
            b
            for b, p in (("keel-conductor", self.conductor), ("keel-scheduler", self.scheduler))
            if p.alive
        ]
        async with self.db.acquire() as conn:
            await conn.execute(
                """UPDATE services SET last_seen_up = now(), report_count = report_count + 1
                    WHERE "binary" = ANY($1::text[]) AND deleted_at IS NULL""",
                alive,
            )

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass (see the module docstring): every stored time moves back
        and the hosts' clocks move on. Nothing runs: see :meth:`pass_time`."""
        async with self.db.acquire() as conn:
            await conn.execute("SELECT model_shift(make_interval(secs => $1))", float(seconds))
        self._offset += seconds

    async def pass_time(self, seconds: float) -> None:
        """``seconds`` pass, and what runs by itself meanwhile runs: the control plane's
        heartbeats, the heartbeat of every agent that can reach it (renewing its fence's
        lease), then every fence looks at its lease (firing where it ran out)."""
        await self.advance(seconds)
        await self.control_heartbeats()
        for host in self.hosts:
            if host.cut_for is None:
                self.heartbeat(host)
            else:
                host.cut_for += seconds
        await self.rt.idle()
        wake_fences(self)
        await self.rt.idle()

    # -- the I3 watch --------------------------------------------------------------------

    async def _destroying(self, host: Host, instance_uuid: UUID, token: UUID | None) -> None:
        if self.on_destroy is not None:
            self.rt.inflight.started()
            try:
                await self.on_destroy(host, instance_uuid, token)
            finally:
                self.rt.inflight.finished()
