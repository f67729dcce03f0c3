"""The state machine Hypothesis drives: operations, faults, and the invariants after each.

Each rule is one thing that can happen to a cloud — an API call, a process killed or
started, a host crashing, an operator command, time passing, a periodic job — or one
thing the broker does with a held message: deliver it (perhaps pausing its handler at
its n-th checkpoint, or killing its process there, or losing the acknowledgement so it
comes back), duplicate it, or deliver two at once, interleaved step by step in an order
Hypothesis draws. Any request may meet a broker that loses its confirms (every cast
keel-api makes for it fails, before or after the broker took it), and a boot that goes
through is one step of its own. After every rule the world is run until idle and the
per-step invariants are checked; at the end of each example :meth:`KeelMachine.teardown` settles
the cloud (everything delivered and resumed, every host back, every deadline passed and
swept) and checks the invariants of quiescence (:mod:`tests.model.invariants`).

The model's operator does anything the API accepts, at any moment: evacuates any
server (keel-api decides whether its host is fenced), forces hosts down and up, deletes
services, resets servers' states, migrates (cold and live, aborting or force-completing
a live migration at any moment), resizes, deletes (soft delete on for an even seed, off
for an odd one), restores and force-deletes; the API is the guard, and a refusal is fine.
Only what keel cannot check is done as its documentation says: a host is renamed while
its agent is stopped, and a host that reported no armed fence is turned off before it is
forced down (keel then has only the operator's word).

Rules gated on :data:`tests.model.known.UNFIXED` stay off while the finding they would
trip over is open (its explicit example in ``test_findings*.py`` is an xfail), so the
search keeps finding *new* problems on main.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from services.api.servers import publish
from shared.db import service_maintenance
from shared.exceptions import KeelError
from shared.rpc.fake import CallFault
from shared.versions import HOST_FENCE_VERSION, SERVICE_VERSION, TAKING_REQUESTS_VERSION
from tests.model import known
from tests.model.base import TRACE, TRACE_FILE, MachineBase
from tests.model.hosts import Host
from tests.model.runtime import Activity, Process
from tests.model.world import BIG_FLAVOR, DOWN_TIME, IMAGE_ID, LEASE_RUNS_OUT

LOG = logging.getLogger(__name__)

index = st.integers(min_value=0, max_value=7)
hosts = st.integers(min_value=0, max_value=2)
#: What happens to the activity a rule starts: nothing, a pause or a kill at step n.
plans = st.one_of(
    st.just({}),
    st.builds(lambda n: {"pause_at": n}, st.integers(1, 12)),
    st.builds(lambda n: {"kill_at": n}, st.integers(1, 12)),
)
#: What happens to a request a rule sends: what may happen to any activity, or every cast
#: keel-api makes for it fails, its messages perhaps gone out all the same (a broker that
#: loses its confirms for a while): keel-api answers 503, which must mean nothing happens.
requests = st.one_of(
    plans,
    st.builds(lambda delivered: {"casts_fail": delivered}, st.booleans()),
)
#: The release the agents run when an example begins: this one mostly, sometimes the one
#: before requests were taken (conductor RPC 1.11): a rolling upgrade under way, whose
#: agents are upgraded as the model restarts them.
releases = st.sampled_from([SERVICE_VERSION] * 3 + [TAKING_REQUESTS_VERSION - 1])
ADVANCES = (30.0, DOWN_TIME + 1, 121.0, 601.0, 1801.0, 3601.0)


class KeelMachine(MachineBase):
    """The rules (see the module's text); the plumbing is :class:`MachineBase`."""

    @initialize(release=releases)
    def upgrade_under_way(self, release: int) -> None:
        """Begin with the agents of an older release (the rest of the cloud upgraded)."""
        if not self.started or release != SERVICE_VERSION:
            self.restart_as(release)

    # -- the API -----------------------------------------------------------------------

    @rule(on=st.none() | hosts, plan=requests)
    def create(self, on: int | None = None, plan: dict[str, Any] | None = None) -> None:
        server: dict[str, Any] = {
            "name": "s",
            "flavorRef": "1",
            "imageRef": str(IMAGE_ID),
            "networks": "none",
        }
        if on is not None:
            server["host"] = self.host(on).name  # a requested host (2.74): still filtered
        self.creates_sent += 1
        self.api(
            "create", "POST", "/v2.1/servers", body={"server": server}, version="2.74", plan=plan
        )

    @rule(on=st.none() | hosts)
    def boot(self, on: int | None = None) -> None:
        """A create that goes through: every message it and what came before it cast is
        delivered (most boots meet no fault; an example spends its steps on later ones)."""
        self.create(on)
        self.deliver_all()

    @rule(
        on=st.none() | hosts,
        copies=st.integers(1, 3),
        failing=st.booleans(),
        after=st.integers(1, 3),
        results=st.integers(0, 3),
    )
    def boot_delivered_again(
        self, on: int | None, copies: int, failing: bool, after: int, results: int
    ) -> None:
        """A create whose build reaches its agent ``copies`` times (the broker gives it
        again: an acknowledgement lost, a connection dropped), the first spawn failing if
        ``failing``; once the ``after``-th copy ran, the oldest ``results`` build results
        are delivered, the others held for later steps. (Delivering each message of a
        boot on its own takes a dozen steps in the right order: this is one.)"""
        self.create(on)
        if not self.deliver_named("build_instances"):
            return
        marker = b'"method":"build_and_run_instance"'
        held = next((h for h in self.deliverable() if marker in h.message.body), None)
        if held is None:
            return
        if failing:
            builder = self.consumer_of(held.topic)
            for h, agent in self.w.agents.items():
                if agent is builder:
                    self.w.hosts[h].driver.fail_next.add("spawn")
        for _ in range(copies - 1):
            self.act(self._start(lambda: self.rt.broker.duplicate(held)))
        for n in range(1, copies + 1):
            copy = next((h for h in self.deliverable() if h.message == held.message), None)
            if copy is None:
                return
            self.act(self._start(lambda c=copy: self._deliver(c)))
            if n == after:
                for _ in range(results):
                    self.deliver_named("instance_build_result")

    @rule(i=index, plan=requests)
    def delete(self, i: int, plan: dict[str, Any] | None = None) -> None:
        if not self.servers or self.gated_by_move(i, known.DELETE_DURING_MOVE):
            return
        self.api("delete", "DELETE", f"/v2.1/servers/{self.server(i)}", plan=plan)

    @rule(i=index, action=st.sampled_from(["os-stop", "os-start", "soft", "hard"]), plan=requests)
    def power(self, i: int, action: str, plan: dict[str, Any] | None = None) -> None:
        if not self.servers:
            return
        body: dict[str, Any] = (
            {"reboot": {"type": action.upper()}} if action in ("soft", "hard") else {action: None}
        )
        self.api(action, "POST", f"/v2.1/servers/{self.server(i)}/action", body=body, plan=plan)

    @rule(i=index, plan=requests)
    def rebuild(self, i: int, plan: dict[str, Any] | None = None) -> None:
        """Rebuild a server from its image, in any state: keel-api refuses what it must."""
        if not self.servers:
            return
        body = {"rebuild": {"imageRef": str(IMAGE_ID)}}
        self.api("rebuild", "POST", f"/v2.1/servers/{self.server(i)}/action", body=body, plan=plan)

    @rule(
        i=index,
        action=st.sampled_from(["addSecurityGroup", "removeSecurityGroup"]),
        plan=requests,
    )
    def security_group(self, i: int, action: str, plan: dict[str, Any] | None = None) -> None:
        """Take a server out of its project's default group, or put it back, in any state
        (a 400 for a server already in it, or already out, is an answer)."""
        if not self.servers:
            return
        body = {action: {"name": "default"}}
        self.api(action, "POST", f"/v2.1/servers/{self.server(i)}/action", body=body, plan=plan)

    @rule(i=index, plan=requests)
    def snapshot(self, i: int, plan: dict[str, Any] | None = None) -> None:
        """Snapshot a server (createImage), in any state: keel-api refuses what it must.
        The agents' uploads are taken by the world as keel-api takes them."""
        if not self.servers:
            return
        body = {"createImage": {"name": "snap"}}
        self.api("snapshot", "POST", f"/v2.1/servers/{self.server(i)}/action", body=body, plan=plan)

    @rule(
        i=index,
        action=st.sampled_from(["shelve", "shelveOffload", "unshelve", "unshelve-az"]),
        plan=requests,
    )
    def shelve(self, i: int, action: str, plan: dict[str, Any] | None = None) -> None:
        """Shelve, offload or unshelve a server (into its zone, 2.77), in any state:
        keel-api refuses what it must. The search runs with KEEL_SHELVED_OFFLOAD_TIME 0
        (a shelve offloads at once); ``shelveOffload`` meets SHELVED servers only in the
        findings' examples that set it otherwise."""
        if not self.servers:
            return
        value: Any = {"availability_zone": "nova"} if action == "unshelve-az" else None
        name = "unshelve" if action == "unshelve-az" else action
        self.api(
            name,
            "POST",
            f"/v2.1/servers/{self.server(i)}/action",
            body={name: value},
            version="2.77",
            plan=plan,
        )

    @rule(i=index, action=st.sampled_from(["restore", "forceDelete"]), plan=requests)
    def deferred_delete(self, i: int, action: str, plan: dict[str, Any] | None = None) -> None:
        """Restore or force-delete a server, soft-deleted or not (os-deferred-delete)."""
        if not self.servers:
            return
        body = {action: None}
        self.api(action, "POST", f"/v2.1/servers/{self.server(i)}/action", body=body, plan=plan)

    @rule(i=index, to=st.none() | hosts, plan=requests)
    def evacuate(self, i: int, to: int | None = None, plan: dict[str, Any] | None = None) -> None:
        """Evacuate a server whatever its host's state: keel-api decides whether the host
        is fenced (a live host, one merely silent, one whose agent died: refused)."""
        server = self.server(i)
        if server is not None:
            self._evacuate(server, to, plan)

    def _evacuate(
        self, server: UUID, to: int | None = None, plan: dict[str, Any] | None = None
    ) -> None:
        body: dict[str, Any] = {"evacuate": {} if to is None else {"host": self.host(to).name}}
        self.api(
            "evacuate",
            "POST",
            f"/v2.1/servers/{server}/action",
            body=body,
            version="2.29",
            plan=plan,
        )

    @rule(i=index, to=st.none() | hosts)
    def evacuate_crashed(self, i: int, to: int | None = None) -> None:
        """Its host crashes and is forced down, then the server is evacuated, and time
        passes until the host's fence lease has run out (one step, so that a short example
        reaches moves back and forth)."""
        server = self.server(i)
        if server is None:
            return
        source = self.run(self._host_of(server))
        if source is None or source.gone:
            return
        if source.powered:
            self.crash(source.index, force_down=True)
        self.evacuate(i, to)
        self.deliver_all()
        self.advance(LEASE_RUNS_OUT)
        self.sweep()
        self.deliver_all()

    @rule(i=index, to=st.none() | hosts, force_down=st.booleans())
    def evacuate_dead_agent(self, i: int, to: int | None = None, force_down: bool = False) -> None:
        """The agent of the server's host dies while the host and its guests run on; the
        operator perhaps forces the host down, and evacuates the server straight away
        (keel-api decides whether the host is fenced; the copy there must be off before
        another starts). One step, as an operator does it when an agent will not start."""
        settled = self.run(self._settled_on_live_agents())
        if not settled:
            return
        server, source = settled[i % len(settled)]
        self.kill_agent(source.index)
        if force_down:
            self.force_down(source.index, True)
        self._evacuate(server, to)
        self.deliver_all()

    async def _settled_on_live_agents(self) -> list[tuple[UUID, Host]]:
        """The servers built and at rest on a powered host whose agent runs, oldest first:
        those whose agent's death an evacuation must not outrun."""
        async with self.w.db.acquire() as conn:
            rows = await conn.fetch(
                """SELECT i.uuid, n.uuid AS node FROM instances i
                     JOIN compute_nodes n ON n.id = i.compute_id
                    WHERE i.deleted_at IS NULL AND i.task_state IS NULL
                      AND i.vm_state IN ('active', 'stopped')
                    ORDER BY i.id"""
            )
        hosts = {h.node_uuid: h for h in self.w.hosts if h.node_uuid is not None}
        return [
            (row["uuid"], host)
            for row in rows
            if (host := hosts.get(row["node"])) is not None
            and host.powered
            and not host.gone
            and host.cut_for is None
            and self.w.agent(host) is not None
        ]

    @rule(h=hosts)
    def bring_back(self, h: int) -> None:
        """A crashed host comes back: its agent starts (and reconciles), then it is forced up."""
        host = self.host(h)
        if host.gone or host.cut_for is not None:
            return
        self.start_agent(h)
        self.force_down(h, False)

    @rule(i=index, state=st.sampled_from(["active", "error"]))
    def reset_state(self, i: int, state: str) -> None:
        """An admin resets the server's state (os-resetState), whatever it is doing."""
        server = self.server(i)
        if server is None:
            return
        self.observer.reset.add(server)
        body = {"os-resetState": {"state": state}}
        self.api("os-resetState", "POST", f"/v2.1/servers/{server}/action", body=body)

    @rule(i=index, to=st.none() | hosts, plan=requests)
    def migrate(self, i: int, to: int | None = None, plan: dict[str, Any] | None = None) -> None:
        if not self.servers:
            return
        body: dict[str, Any] = {"migrate": None if to is None else {"host": self.host(to).name}}
        self.api(
            "migrate",
            "POST",
            f"/v2.1/servers/{self.server(i)}/action",
            body=body,
            version="2.56",
            plan=plan,
        )

    @rule(i=index, to=st.none() | hosts, force=st.booleans(), plan=requests)
    def live_migrate(
        self, i: int, to: int | None = None, force: bool = False, plan: dict[str, Any] | None = None
    ) -> None:
        """os-migrateLive at any moment (2.30: a named host may be forced)."""
        if not self.servers:
            return
        value: dict[str, Any] = {
            "host": None if to is None else self.host(to).name,
            "block_migration": "auto",
        }
        if force:
            value["force"] = True
        self.api(
            "os-migrateLive",
            "POST",
            f"/v2.1/servers/{self.server(i)}/action",
            body={"os-migrateLive": value},
            version="2.30",
            plan=plan,
        )

    @rule(i=index, abort=st.booleans(), plan=requests)
    def end_live_migration(self, i: int, abort: bool, plan: dict[str, Any] | None = None) -> None:
        """Abort (2.65) or force-complete (2.22) the server's latest live migration."""
        server = self.server(i)
        if server is None:
            return
        number = self.run(self._latest_live_migration(server))
        if number is None:
            return
        path = f"/v2.1/servers/{server}/migrations/{number}"
        if abort:
            self.api("live-abort", "DELETE", path, version="2.65", plan=plan)
        else:
            body = {"force_complete": None}
            self.api("force_complete", "POST", f"{path}/action", body=body, version="2.22")

    async def _latest_live_migration(self, server: UUID) -> int | None:
        async with self.w.db.acquire() as conn:
            found: int | None = await conn.fetchval(
                """SELECT max(id) FROM migrations
                    WHERE instance_uuid = $1 AND migration_type = 'live-migration'""",
                server,
            )
        return found

    @rule(i=index, flavor=st.sampled_from(["1", BIG_FLAVOR]), plan=requests)
    def resize(self, i: int, flavor: str, plan: dict[str, Any] | None = None) -> None:
        """A cold migration to another flavor (to the server's own flavor: 400)."""
        if not self.servers:
            return
        body = {"resize": {"flavorRef": flavor}}
        self.api("resize", "POST", f"/v2.1/servers/{self.server(i)}/action", body=body, plan=plan)

    @rule(i=index, confirm=st.booleans(), plan=requests)
    def finish_resize(self, i: int, confirm: bool, plan: dict[str, Any] | None = None) -> None:
        if not self.servers:
            return
        name = "confirmResize" if confirm else "revertResize"
        self.api(
            name, "POST", f"/v2.1/servers/{self.server(i)}/action", body={name: None}, plan=plan
        )

    @rule(h=hosts, down=st.booleans())
    def force_down(self, h: int, down: bool) -> None:
        """Force a host down (or up). keel trusts the operator's word only for a host that
        reported no armed fence; the operator makes sure such a host is off first, as
        keel's refusals say — a host with an armed fence is forced down as it is."""
        host = self.host(h)
        service = self.run(self._service_uuid(host))
        if down and host.powered and service is not None and not self.run(self._armed(host)):
            self.act(self._crash(host))
        if service is not None:
            self.api(
                f"forced_down={down}",
                "PUT",
                f"/v2.1/os-services/{service}",
                body={"forced_down": down},
                version="2.53",
            )

    @rule(h=hosts)
    def delete_service(self, h: int) -> None:
        """Delete a host's compute service (keel-api refuses while it may be in use)."""
        host = self.host(h)
        service = self.run(self._service_uuid(host))
        if service is None:
            return
        self.api("service delete", "DELETE", f"/v2.1/os-services/{service}", version="2.53")
        self.run(self._mark_gone(host))

    async def _mark_gone(self, host: Host) -> None:
        async with self.w.db.acquire() as conn:
            left = await conn.fetchval(
                """SELECT count(*) FROM services WHERE host = $1 AND "binary" = 'keel-compute'
                     AND deleted_at IS NULL""",
                host.name,
            )
        host.gone = left == 0

    @rule(h=hosts)
    def rename(self, h: int) -> None:
        host = self.host(h)
        if self.w.agent(host) is not None or host.gone:
            return  # renamed only while its agent is stopped

        async def rename() -> None:
            new = f"host{host.index}r{self.renames + 1}"
            async with self.w.db.acquire() as conn:
                try:
                    await service_maintenance.rename_compute(conn, host.name, new, DOWN_TIME)
                except KeelError:
                    return
            self.renames += 1
            host.name = new

        self.act(rename())

    # -- processes and hosts -----------------------------------------------------------

    @rule(h=hosts, force_down=st.booleans())
    def crash(self, h: int, force_down: bool) -> None:
        host = self.host(h)
        self.act(self._crash(host))
        if force_down:
            self.force_down(h, True)

    async def _crash(self, host: Host) -> None:
        self.w.crash(host)

    async def _armed(self, host: Host) -> bool:
        """Whether the host's last heartbeat reported an armed fence."""
        async with self.w.db.acquire() as conn:
            return bool(
                await conn.fetchval(
                    """SELECT fence_lease IS NOT NULL AND version >= $2 FROM services
                        WHERE host = $1 AND "binary" = 'keel-compute' AND deleted_at IS NULL""",
                    host.name,
                    HOST_FENCE_VERSION,
                )
            )

    @rule(h=hosts)
    def kill_fence(self, h: int) -> None:
        """The host's keel-fence dies. Its agent, if alive, starts it again within a second
        (its contact watch); with no agent to do so, the host's watchdog resets the host:
        agent and fence gone at once is the double fault the watchdog covers."""
        host = self.host(h)
        process = self.w.fences.get(host.index)
        if process is None or not process.alive:
            return
        self.act(self._kill(process))
        if self.w.agent(host) is not None:
            self.watch(h)
        elif host.powered:
            self.act(self._crash(host))

    @rule(h=hosts)
    def watch(self, h: int) -> None:
        """The agent's contact watch looks (its timer): its fence runs, contact is back."""
        self.act(self._start(lambda: self.w.watch(self.host(h))))

    @rule(h=hosts)
    def kill_agent(self, h: int) -> None:
        process = self.w.agent(self.host(h))
        if process is not None:
            self.act(self._kill(process))

    async def _kill(self, process: Process) -> None:
        self.rt.kill(process)

    @rule(h=hosts)
    def start_agent(self, h: int) -> None:
        """Start the host's agent (of this release: an old one is upgraded so)."""
        host = self.host(h)
        if not host.gone and host.cut_for is None:
            self.act(self.w.start_agent(host))

    # -- partitions --------------------------------------------------------------------

    @rule(h=hosts)
    def cut(self, h: int) -> None:
        """The host's network is cut: nothing reaches its agent, nothing it sends leaves."""
        host = self.host(h)
        process = self.w.agent(host)
        if process is None or host.cut_for is not None:
            return
        host.cut_for = 0.0
        process.cut = True
        self.w.agent_objects[host.index].contact.contact_lost()

    @rule(h=hosts, plan=plans)
    def heal(self, h: int, plan: dict[str, Any] | None = None) -> None:
        """The cut heals: the agent's heartbeats get through, and it reconciles (its
        watchdog's look) before it starts anything again."""
        host = self.host(h)
        if host.cut_for is None:
            return
        self.act(self._heal(host, **(plan or {})))

    @rule(which=st.sampled_from(["conductor", "scheduler", "api"]))
    def kill_control(self, which: str) -> None:
        process = getattr(self.w, which)
        if process.alive:
            self.act(self._kill(process))

    @rule(which=st.sampled_from(["conductor", "scheduler"]))
    def start_control(self, which: str) -> None:
        process = getattr(self.w, which)
        if not process.alive:
            self.act(self.w.start_conductor() if which == "conductor" else self.w.start_scheduler())

    @rule(
        which=st.sampled_from(["api", "conductor"]),
        delivered=st.booleans(),
        times=st.sampled_from([1, publish.ATTEMPTS]),
    )
    def cast_fails(self, which: str, delivered: bool, times: int = 1) -> None:
        """The next cast of keel-api (or the conductor) fails, perhaps after it went out;
        or the next few do (a broker that loses its confirms for a while: every attempt
        keel-api makes at one request fails, and it answers 503)."""
        process = getattr(self.w, which)
        if not process.alive or process.transport is None:
            return
        for _ in range(times):
            process.transport.fail_next_cast(delivered=delivered)

    @rule(
        who=st.sampled_from(["api", "conductor", "scheduler", "agent"]),
        h=hosts,
        fault=st.sampled_from(["unsent", "early", "reply_lost", "twice", "held"]),
    )
    def call_disturbed(self, who: str, h: int, fault: CallFault) -> None:
        """The next call a process makes is disturbed: it never arrives, its caller times
        out before or after the callee acted, the callee gets it twice, or it waits in
        its queue for the model to deliver it (an agent's heartbeats and reports are
        calls too)."""
        process = self.w.agent(self.host(h)) if who == "agent" else getattr(self.w, who)
        if process is None or not process.alive or process.transport is None:
            return
        process.transport.disturb_next_call(fault)

    @rule(who=st.sampled_from(["api", "conductor", "scheduler"]), count=st.integers(1, 4))
    def database_outage(self, who: str, count: int) -> None:
        """The next ``count`` connections a control-plane process asks for are refused:
        the database (or the path to it) is gone for a moment, mid-step or between."""
        process = getattr(self.w, who)
        if process.alive:
            process.pool.outage += count

    @rule(who=st.sampled_from(["api", "conductor", "scheduler"]))
    def commit_answer_lost(self, who: str) -> None:
        """The next commit of a control-plane process is done, and its connection drops
        before the answer comes back: the process cannot tell whether it happened."""
        process = getattr(self.w, who)
        if process.alive and known.LOST_COMMITS_FLAKY not in known.UNFIXED:
            process.pool.lost_commits += 1

    @rule(h=hosts, operation=st.sampled_from(["spawn", "rebuild"]))
    def fail_next(self, h: int, operation: str) -> None:
        self.host(h).driver.fail_next.add(operation)

    # -- time and periodic work --------------------------------------------------------

    @rule(seconds=st.sampled_from(ADVANCES))
    def advance(self, seconds: float) -> None:
        self.act(self._advance(seconds))

    async def _advance(self, seconds: float) -> None:
        """Time passes: fences whose lease ran out fire (on their own), then every
        process does what its timers would have done meanwhile."""
        await self.w.pass_time(seconds)
        for host in self.w.hosts:
            self.w.watch(host)

    @rule(h=hosts, plan=plans)
    def guest_report(self, h: int, plan: dict[str, Any] | None = None) -> None:
        self.act(self._start(lambda: self.w.reconcile(self.host(h), **(plan or {}))))

    @rule(plan=plans)
    def sweep(self, plan: dict[str, Any] | None = None) -> None:
        self.act(self._start(lambda: self.w.sweep(**(plan or {}))))

    # -- messages ----------------------------------------------------------------------

    @rule(k=index, plan=plans, lose_ack=st.booleans())
    def deliver(self, k: int, plan: dict[str, Any] | None = None, lose_ack: bool = False) -> None:
        ready = self.deliverable()
        if not ready:
            return
        self.act(
            self._start(
                lambda: self._deliver(ready[k % len(ready)], lose_ack=lose_ack, **(plan or {}))
            )
        )

    @rule()
    def deliver_oldest(self) -> None:
        ready = self.deliverable()
        if ready:
            self.act(self._start(lambda: self._deliver(ready[0])))

    @rule()
    def deliver_all(self) -> None:
        """Run handlers until quiescent: every held message, oldest first."""
        self.act(self.drain())

    @rule(k=index)
    def duplicate(self, k: int) -> None:
        ready = self.deliverable()
        if not ready:
            return
        self.act(self._start(lambda: self.rt.broker.duplicate(ready[k % len(ready)])))

    @rule(k=index, j=st.none() | index, order=st.lists(st.integers(0, 1), max_size=10))
    def interleave(self, k: int, j: int | None, order: list[int]) -> None:
        """Deliver message k with a duplicate of it (or with message j), step by step."""
        ready = self.deliverable()
        if not ready:
            return
        first = ready[k % len(ready)]
        second = ready[j % len(ready)] if j is not None else first
        if second is first:
            # A second copy of the same message (over RabbitMQ it arrives a little later).
            self.act(self._start(lambda: self.rt.broker.duplicate(first)))
            copies = [h for h in self.deliverable() if h.message == first.message and h != first]
            if not copies:
                return
            second = copies[-1]
        pair: list[Activity | None] = []

        async def begin() -> None:
            pair.append(self._deliver(first, step=True))
            pair.append(self._deliver(second, step=True))

        self.act(begin())
        for choice in order:
            activity = pair[choice]
            if activity is not None and activity.paused is not None and not activity.paused.done():
                self.act(self._start(lambda a=activity: self.rt.resume(a)))
        for activity in pair:
            if activity is not None:
                self.act(self._start(lambda a=activity: self.rt.resume(a, step=False)))

    @rule(k=index)
    def resume(self, k: int) -> None:
        paused = self.rt.paused()
        if not paused:
            return
        self.act(self._start(lambda: self.rt.resume(paused[k % len(paused)], step=False)))

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def every_step(self) -> None:
        if TRACE_FILE and self.started:
            self.runner.run(self._trace())
        if self.runs == self.checked_at_run:
            # Nothing ran on the world's loop since the last check (a rule that found
            # nothing to do, or only armed a fault for later): every row, guest, dead
            # letter and answer the invariants read is as it was then.
            return
        self.checked_at_run = self.runs
        problems = self.runner.run(self.observer.after_step())
        self.servers = self.observer.servers
        if problems and TRACE:
            print("model: after a step:", *problems, sep="\n  ")
        self.failed(problems)
        assert not problems, "\n".join(problems)
