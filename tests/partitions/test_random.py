"""A randomized partition run: four agents cut, healed and degraded while servers come
and go, are evacuated and migrated; the history is checked afterwards.

The run lasts ``KEEL_PARTITIONS_SECONDS`` (600 by default; 120 under CI) and is seeded
by ``KEEL_PARTITIONS_SEED`` (random otherwise; printed either way, so a failure can be
run again). Operations: create (on a random host or wherever), delete, evacuate, cold
migrate, confirm; faults: a link cut, a refused broker connection, packet loss, delay,
each for a random time — at most two of the four hosts faulty at once — and heals. A
sampler reads every agent's guests every half second. Afterwards every fault is healed
and the control plane is given its deadlines; then:

* never two running copies of one server, at any sample;
* no server lost: each create answered 202 ends ACTIVE, SHUTOFF or ERROR, or is gone
  if (and only if) a delete of it was answered 204;
* each live server's guest on its host runs if it is ACTIVE and is off if SHUTOFF, and
  no copy of it runs anywhere else;
* usage equals the sum of allocations;
* no task state and no move record that has not ended.

It prints the number of operations and faults.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from devkit import CIRROS_ID
from shared.db import allocations
from tests.e2e.cloud import Cloud, CloudConfig
from tests.partitions.harness import (
    SETTLE,
    Hosts,
    Sampler,
    config,
    guest_states,
)
from tests.polling import wait_until

HOSTS = tuple(f"r-{i}" for i in range(1, 5))
SECONDS = float(
    os.environ.get("KEEL_PARTITIONS_SECONDS") or (120 if os.environ.get("CI") == "true" else 600)
)
#: Move records that have ended.
ENDED = {"completed", "confirmed", "reverted", "error", "failed", "cancelled"}
#: Servers a run keeps at most (four hosts of 4 vCPUs take 16 tiny ones).
MOST_SERVERS = 10

pytestmark = [pytest.mark.partitions, pytest.mark.timeout(SECONDS + 900)]


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return config(
        ("KEEL_BUILD_TIMEOUT", "40"),
        ("KEEL_MOVE_TIMEOUT", "40"),
        ("KEEL_TASK_TIMEOUT", "30"),
        ("KEEL_RESIZE_CONFIRM_WINDOW", "10"),
        ("KEEL_QUOTA__INSTANCES", "-1"),
        ("KEEL_QUOTA__CORES", "-1"),
        ("KEEL_QUOTA__RAM", "-1"),
    )


@dataclass
class History:
    """What the run did and what keel answered."""

    began: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str, str, int]] = field(default_factory=list)
    accepted: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    operations: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)

    def note(self, op: str, target: str, status: int) -> None:
        self.events.append((time.monotonic() - self.began, op, target, status))
        self.operations[f"{op} {status}"] += 1


class Run:
    def __init__(self, cloud: Cloud, hosts: Hosts, rng: random.Random) -> None:
        self.cloud = cloud
        self.hosts = hosts
        self.rng = rng
        self.history = History()
        #: Faulty host → when its fault ends.
        self.faulty: dict[str, float] = {}

    async def api(self, method: str, path: str, body: Any = None, version: str = "2.74") -> int:
        headers = {"OpenStack-API-Version": f"compute {version}"}
        async with self.cloud.http(self.cloud.admin_token) as http:
            try:
                response = await http.request(method, path, json=body, headers=headers)
            except httpx.HTTPError:
                return 0
        if method == "POST" and path == "servers" and response.status_code == 202:
            self.history.accepted.add(response.json()["server"]["id"])
        return response.status_code

    async def servers(self) -> list[dict[str, Any]]:
        found = await self.cloud.get("servers/detail?limit=1000", version="2.74")
        listed: list[dict[str, Any]] = found["servers"]
        return listed

    # --- operations ----------------------------------------------------------------------

    async def create(self) -> None:
        body: dict[str, Any] = {
            "name": f"rnd-{len(self.history.accepted)}",
            "flavorRef": "1",
            "imageRef": str(CIRROS_ID),
        }
        if self.rng.random() < 0.5:
            body["host"] = self.rng.choice(HOSTS)
        status = await self.api("POST", "servers", {"server": body})
        self.history.note("create", body.get("host", "-"), status)

    async def on_one(self, op: str, statuses: tuple[str, ...]) -> None:
        candidates = [s for s in await self.servers() if s["status"] in statuses]
        if op == "evacuate":
            # Mostly the servers of a host cut off now: those keel may let go.
            cut_off = [s for s in candidates if s["OS-EXT-SRV-ATTR:host"] in self.faulty]
            if cut_off and self.rng.random() < 0.8:
                candidates = cut_off
        if not candidates:
            return
        server = self.rng.choice(candidates)
        sid = server["id"]
        if op == "delete":
            status = await self.api("DELETE", f"servers/{sid}")
            if status == 204:
                self.history.deleted.add(sid)
        elif op == "evacuate":
            status = await self.api("POST", f"servers/{sid}/action", {"evacuate": {}}, "2.29")
        elif op == "migrate":
            status = await self.api("POST", f"servers/{sid}/action", {"migrate": None}, "2.56")
        else:
            status = await self.api("POST", f"servers/{sid}/action", {"confirmResize": None})
        self.history.note(op, sid, status)

    async def operate(self) -> None:
        live = len(self.history.accepted - self.history.deleted)
        choice = self.rng.random()
        if choice < 0.3 and live < MOST_SERVERS:
            await self.create()
        elif choice < 0.45:
            await self.on_one("delete", ("ACTIVE", "SHUTOFF", "ERROR", "BUILD"))
        elif choice < 0.7:
            await self.on_one("evacuate", ("ACTIVE", "SHUTOFF", "ERROR"))
        elif choice < 0.9:
            await self.on_one("migrate", ("ACTIVE", "SHUTOFF"))
        else:
            await self.on_one("confirm", ("VERIFY_RESIZE",))

    # --- faults --------------------------------------------------------------------------

    def heal_due(self, *, everything: bool = False) -> None:
        now = time.monotonic()
        for name, until in list(self.faulty.items()):
            if everything or until <= now:
                self.hosts.heal(name)
                del self.faulty[name]
                self.history.faults["heal"] += 1

    def fault(self) -> None:
        self.heal_due()
        healthy = [h for h in HOSTS if h not in self.faulty]
        if len(self.faulty) >= 2 or not healthy:
            return
        name = self.rng.choice(healthy)
        net = self.hosts.nets[name]
        parts = self.hosts.partitions
        kind = self.rng.choice(["cut", "cut", "refused", "loss", "delay"])
        # Shorter and longer than the self-fence window (8 s).
        lasts = self.rng.choice([3.0, 6.0, 12.0, 20.0, 30.0, 45.0])
        if kind == "cut":
            parts.cut(net)
        elif kind == "refused":
            parts.cut_forwarder(net)
        elif kind == "loss":
            if not parts.loss(net, self.rng.choice([10, 30, 60])):
                return
        else:
            parts.delay(net, self.rng.choice([0.2, 0.5, 1.5]))
        self.faulty[name] = time.monotonic() + lasts
        self.history.faults[kind] += 1
        self.history.events.append((time.monotonic() - self.history.began, kind, name, 0))

    async def run(self, seconds: float) -> None:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            if self.rng.random() < 0.25:
                self.fault()
            else:
                self.heal_due()
                await self.operate()
            await asyncio.sleep(self.rng.uniform(0.3, 1.5))
        self.heal_due(everything=True)


async def quiescent(cloud: Cloud, hosts: Hosts) -> str | None:
    """Why the cloud has not settled yet (``None`` once it has)."""
    up = await cloud.up_services()
    down = [h for h in HOSTS if ("keel-compute", h) not in up]
    if down:
        return f"agents down: {down}"
    async with cloud.pool.acquire() as conn:
        tasks = await conn.fetch(
            "SELECT uuid, task_state FROM instances WHERE deleted_at IS NULL"
            " AND task_state IS NOT NULL"
        )
        moves = await conn.fetch(
            "SELECT uuid, status FROM migrations WHERE NOT (status = ANY($1::text[]))",
            sorted(ENDED),
        )
        live = await conn.fetch(
            "SELECT uuid::text, host, vm_state FROM instances WHERE deleted_at IS NULL"
        )
    if tasks:
        return f"task states left: {[(str(r[0]), r[1]) for r in tasks]}"
    if moves:
        return f"moves not ended: {[(str(r[0]), r[1]) for r in moves]}"
    copies = {h: guest_states(hosts.state_dir(h)) for h in HOSTS}
    for row in live:
        sid, host, vm_state = row["uuid"], row["host"], row["vm_state"]
        if vm_state not in ("active", "stopped", "error"):
            return f"server {sid} is {vm_state}"
        if vm_state == "error":
            continue
        here = copies.get(host, {}).get(sid)
        wanted = "running" if vm_state == "active" else "shutdown"
        if here != wanted:
            return f"server {sid} is {vm_state} on {host}, its guest there is {here}"
    return None


async def test_a_randomized_partition_run_keeps_every_promise(cloud: Cloud, hosts: Hosts) -> None:
    seed = int(os.environ.get("KEEL_PARTITIONS_SEED") or random.randrange(2**32))
    print(f"\nrandomized partition run: seed {seed}, {SECONDS:g} s")
    await hosts.start_all(HOSTS)
    run = Run(cloud, hosts, random.Random(seed))
    with Sampler(hosts) as sampler:
        await run.run(SECONDS)
        settled: str | None = "not looked yet"

        async def settles() -> bool:
            nonlocal settled
            settled = await quiescent(cloud, hosts)
            return settled is None

        try:
            await wait_until(settles, what="the cloud settling", timeout=SETTLE * 3, interval=2)
        except AssertionError:
            raise AssertionError(f"not settled (seed {seed}): {settled}") from None
    history = run.history
    print(
        f"randomized partition run: {sum(history.operations.values())} operations "
        f"({dict(sorted(history.operations.items()))}), {sum(history.faults.values())} "
        f"faults ({dict(sorted(history.faults.items()))}), {sampler.samples} samples"
    )

    assert sampler.doubles == [], f"seed {seed}: two running copies: {sampler.doubles[:5]}"
    shown = {s["id"]: s for s in await run.servers()}
    for sid in history.accepted:
        if sid in history.deleted:
            assert sid not in shown, f"seed {seed}: deleted server {sid} is still there"
        else:
            assert sid in shown, f"seed {seed}: server {sid} was lost"
            assert shown[sid]["status"] in ("ACTIVE", "SHUTOFF", "ERROR"), shown[sid]
    copies = {h: guest_states(hosts.state_dir(h)) for h in HOSTS}
    for sid, server in shown.items():
        home = server["OS-EXT-SRV-ATTR:host"]
        elsewhere = [h for h in HOSTS if h != home and copies[h].get(sid) == "running"]
        assert elsewhere == [], f"seed {seed}: {sid} also runs on {elsewhere}"
    async with cloud.pool.acquire() as conn:
        assert await allocations.usage_drift(conn) == [], f"seed {seed}"
