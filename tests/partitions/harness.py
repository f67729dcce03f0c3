"""A cloud whose compute agents run on hosts of their own, which the tests cut off.

The control plane (conductor, scheduler, keel-api) is the end-to-end harness's
(:func:`tests.e2e.cloud.running_cloud`, with no agents of its own); each agent runs in
a :class:`devkit.partitions.NetHost` — its own network and UTS namespaces, its kernel
host name its ``KEEL_HOST`` (none is set), its only way out a forwarder to RabbitMQ.
:class:`Sampler` reads every agent's guests from their state directories every half
second, in a thread, and keeps what it saw.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devkit.partitions import NetHost, Partitions
from devkit.processes import BIN, Process
from devkit.servers import AMQP_URL
from tests.e2e.cloud import Cloud, CloudConfig
from tests.polling import wait_until

#: Short windows keep the tier quick: a host is down 4 s after its last heartbeat, fences
#: itself after 8 s without one, and may be evacuated 4 + 8 + 2 s after its last one.
DOWN_TIME = 4.0
FENCE_AFTER = 8.0
MARGIN = 2.0
EVACUABLE_AFTER = DOWN_TIME + FENCE_AFTER + MARGIN
#: Every process's settings in this tier.
SETTINGS = (
    ("KEEL_FENCING__SELF_FENCE_AFTER", f"{FENCE_AFTER:g}"),
    ("KEEL_FENCING__MARGIN", f"{MARGIN:g}"),
    ("KEEL_COMPUTE__RECONCILE_INTERVAL", "2"),
    ("KEEL_RPC__CALL_TIMEOUT", "15"),
)
#: Seconds a step of the control plane may take on a busy machine.
SETTLE = 90.0
#: How often the sampler reads the state directories.
SAMPLE_EVERY = 0.5


def config(*extra: tuple[str, str], computes: tuple[str, ...] = ()) -> CloudConfig:
    """The control plane of this tier; its agents are started by :class:`Hosts`."""
    return CloudConfig(
        computes=computes,
        service_down_time=int(DOWN_TIME),
        self_fence_after=FENCE_AFTER,
        env=SETTINGS + extra,
    )


@dataclass
class Hosts:
    """The cloud's agents, each on a host of its own."""

    cloud: Cloud
    partitions: Partitions
    nets: dict[str, NetHost] = field(default_factory=dict)

    def state_dir(self, name: str) -> Path:
        return self.cloud.state_dir(name)

    def agent_env(self, name: str) -> dict[str, str]:
        """The cloud's environment for an agent: its own broker address, no host name."""
        env = {
            k: v
            for k, v in self.cloud.env.items()
            if k not in ("KEEL_HOST", "KEEL_DATABASE_URL", "KEEL_API_BIND")
        }
        broker = urlsplit(AMQP_URL)
        user = f"{broker.username or 'guest'}:{broker.password or 'guest'}"
        # AMQP heartbeats every 5 s: the broker notices a cut-off agent in a few seconds.
        env["KEEL_TRANSPORT_URL"] = (
            f"amqp://{user}@{self.nets[name].broker_address}{broker.path or '/'}?heartbeat=5"
        )
        env["KEEL_STATE_DIR"] = str(self.state_dir(name))
        return env

    def start(self, name: str) -> Process:
        """Start (again) the agent of host ``name``, making the host the first time."""
        if name not in self.nets:
            self.nets[name] = self.partitions.add_host(name)
        self.state_dir(name).mkdir(parents=True, exist_ok=True)
        argv = self.nets[name].argv(str(BIN / "keel-compute"))
        return self.cloud.group.start(name, argv, self.agent_env(name))

    async def start_all(self, names: Iterable[str]) -> None:
        names = list(names)
        for name in names:
            self.start(name)
        for name in names:
            await self.until_up(name)

    async def until_up(self, name: str, *, up: bool = True, timeout: float = SETTLE) -> None:
        """Until the agent is up (and its last heartbeat reported its host's fence armed:
        only then may a cut host count as fenced), or down."""

        async def check() -> bool:
            process = self.cloud.processes.get(name)
            if up and process is not None and process.exit_code() is not None:
                raise AssertionError(f"agent {name} exited:\n{process.tail()}")
            if (("keel-compute", name) in await self.cloud.up_services()) != up:
                return False
            return not up or await self.fence_armed(name)

        await wait_until(check, what=f"{name} {'up' if up else 'down'}", timeout=timeout)

    async def fence_armed(self, name: str) -> bool:
        async with self.cloud.pool.acquire() as conn:
            lease = await conn.fetchval(
                """SELECT fence_lease FROM services
                    WHERE host = $1 AND "binary" = 'keel-compute' AND deleted_at IS NULL""",
                name,
            )
        return bool(lease)

    def cut(self, *names: str) -> None:
        self.partitions.cut(self.nets[n] for n in names)

    def heal(self, *names: str) -> None:
        self.partitions.heal(self.nets[n] for n in names)

    def fenced(self, name: str) -> bool:
        return (self.state_dir(name) / "fenced.json").exists()

    def log(self, name: str) -> str:
        return self.cloud.processes[name].read_log()


def guest_states(state_dir: Path) -> dict[str, str]:
    """Server id → ``running``/``shutdown``/... of every guest in an agent's state dir."""
    found: dict[str, str] = {}
    try:
        entries = list((state_dir / "instances").iterdir())
    except FileNotFoundError:
        return found
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            power = (entry / "power").read_text().strip() or "running"
        except FileNotFoundError:
            power = "running" if entry.is_dir() else ""
        except NotADirectoryError:
            continue
        if power:
            found[entry.name] = power
    return found


class Sampler:
    """Reads every agent's guests every :data:`SAMPLE_EVERY` s; remembers what it saw.

    ``doubles`` lists (time, server, hosts) whenever a server ran on two hosts at once;
    ``seen`` maps (host, server) to the power states seen, in order (repeats folded).
    """

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.doubles: list[tuple[float, str, list[str]]] = []
        self.seen: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guest-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_EVERY)

    def _read(self, hosts: list[str], *, record: bool) -> dict[str, list[str]]:
        running: dict[str, list[str]] = defaultdict(list)
        for host in hosts:
            for server, power in guest_states(self.hosts.state_dir(host)).items():
                if record:
                    history = self.seen[(host, server)]
                    if not history or history[-1] != power:
                        history.append(power)
                if power == "running":
                    running[server].append(host)
        return running

    def sample(self) -> None:
        """One look; a server seen running on two hosts is read again in the other order
        (a copy stopped and another started between two reads of one look is no double)."""
        hosts = list(self.hosts.nets)
        running = self._read(hosts, record=True)
        doubles = {server for server, where in running.items() if len(where) > 1}
        if doubles:
            again = self._read(hosts[::-1], record=False)
            now = time.monotonic()
            for server in sorted(doubles):
                if len(again.get(server, [])) > 1:
                    self.doubles.append((now, server, sorted(again[server])))
        self.samples += 1

    def states(self, host: str, server: str) -> list[str]:
        return list(self.seen.get((host, server), []))


async def server_of(cloud: Cloud, server_id: str) -> dict[str, Any]:
    server: dict[str, Any] = (await cloud.get(f"servers/{server_id}"))["server"]
    return server


async def until_server(
    cloud: Cloud, server_id: str, check: Any, what: str, timeout: float = SETTLE
) -> dict[str, Any]:
    """The server once ``check(server)`` holds."""
    found: dict[str, Any] = {}

    async def test() -> bool:
        nonlocal found
        found = await server_of(cloud, server_id)
        return bool(check(found))

    await wait_until(test, what=what, timeout=timeout, interval=0.5)
    return found


async def evacuate(cloud: Cloud, server_id: str) -> tuple[int, str]:
    """POST an evacuate as the admin at 2.29: the status and the fault's message."""
    async with cloud.http(cloud.admin_token) as http:
        response = await http.post(
            f"servers/{server_id}/action",
            json={"evacuate": {}},
            headers={"OpenStack-API-Version": "compute 2.29"},
        )
    if response.status_code >= 400:
        body = response.json()
        return response.status_code, next(iter(body.values()))["message"]
    return response.status_code, ""


async def set_metadata(cloud: Cloud, server_id: str, metadata: dict[str, str]) -> None:
    async with cloud.http(cloud.admin_token) as http:
        response = await http.post(f"servers/{server_id}/metadata", json={"metadata": metadata})
    assert response.status_code == 200, response.text


async def records_of(cloud: Cloud, server_id: str) -> list[dict[str, Any]]:
    found = await cloud.get(f"os-migrations?instance_uuid={server_id}", version="2.59")
    records: list[dict[str, Any]] = found["migrations"]
    return records


def dump(value: object) -> str:
    return json.dumps(value, indent=1, default=str)


async def pause(seconds: float) -> None:
    await asyncio.sleep(seconds)
