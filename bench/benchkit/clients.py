"""Clients of the compute API that keep working while something breaks, and what they saw.

Each client talks to every keel-api it is given, in turn; when one refuses the
connection (it is not running) the request goes to the next, as a load balancer would
send it. A request that reached an API and got no answer is not sent again: the client
cannot know whether it was done. A create is then looked up by its server's name, as a
user would look for it, and a server found is the client's like an accepted one.

* :func:`boot_many` — ``boots`` creates from ``clients`` clients, as fast as they are
  answered: which were accepted (202) and with what the others were refused.
* :class:`BootAndDelete` — Rally's boot-and-delete scenario: each client creates a
  server, waits for ACTIVE, deletes it and waits until it is gone, again and again.
  Every request is recorded (:class:`Probe`) and every iteration (:class:`Iteration`),
  for :mod:`benchkit.timeline`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import httpx

from devkit import CIRROS_ID

#: Seconds a client waits for a server to become ACTIVE (or gone) before giving up.
WAIT_TIMEOUT = 180.0
POLL = 0.25
#: Pause after a refused request before the next one.
BACKOFF = 0.5


class Unanswered(Exception):
    """No keel-api took the request (every one refused the connection)."""


@dataclass(frozen=True)
class Probe:
    """One request: when it was answered, and whether it succeeded."""

    at: float
    ok: bool
    what: str


@dataclass(frozen=True)
class Iteration:
    started: float
    ended: float
    ok: bool
    #: What went wrong first (``""`` when nothing did).
    failure: str = ""

    @property
    def latency(self) -> float:
        return self.ended - self.started


class ApiClient:
    """One client: an HTTP client per keel-api, used in turn."""

    def __init__(self, api_urls: Sequence[str], token: str, clock: Callable[[], float]) -> None:
        headers = {"X-Auth-Token": token}
        self._http = [
            httpx.AsyncClient(base_url=f"{url}/v2.1/", headers=headers, timeout=60)
            for url in api_urls
        ]
        self._turn = itertools.cycle(range(len(self._http)))
        self.clock = clock
        self.probes: list[Probe] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send to the next keel-api, or the one after if it refuses the connection."""
        first = next(self._turn)
        for offset in range(len(self._http)):
            http = self._http[(first + offset) % len(self._http)]
            try:
                response = await http.request(method, path, **kwargs)
            except httpx.ConnectError:
                continue
            except httpx.HTTPError as exc:
                self.probes.append(Probe(self.clock(), False, type(exc).__name__))
                raise
            ok = response.status_code < 500
            self.probes.append(Probe(self.clock(), ok, str(response.status_code)))
            return response
        self.probes.append(Probe(self.clock(), False, "refused"))
        raise Unanswered("every keel-api refused the connection")

    async def close(self) -> None:
        for http in self._http:
            await http.aclose()


def server_body(name: str) -> dict[str, Any]:
    return {"server": {"name": name, "imageRef": str(CIRROS_ID), "flavorRef": "1"}}


#: What :func:`create` answers for a create whose answer was lost but whose server exists.
ADOPTED = "unanswered, found by name"


async def create(client: ApiClient, name: str) -> tuple[str, UUID | None]:
    """One create: what came back (a status code or an error), and the id if accepted.

    A create that reached a keel-api and got no answer (it died while answering) may have
    been recorded all the same: the server is looked up by its name, as a user would, and
    if it exists it is the client's (answered :data:`ADOPTED`), to wait for and delete."""
    try:
        response = await client.request("POST", "servers", json=server_body(name))
    except Unanswered as exc:
        return type(exc).__name__, None
    except httpx.HTTPError as exc:
        found = await find_by_name(client, name)
        return (ADOPTED if found else type(exc).__name__), found
    if response.status_code == 202:
        return "202", UUID(response.json()["server"]["id"])
    return str(response.status_code), None


async def find_by_name(client: ApiClient, name: str) -> UUID | None:
    """The server named exactly ``name``, or None once a keel-api said there is none."""
    deadline = time.monotonic() + WAIT_TIMEOUT
    while time.monotonic() < deadline:
        try:
            response = await client.request("GET", "servers", params={"name": f"^{name}$"})
        except (httpx.HTTPError, Unanswered):
            response = None
        if response is not None and response.status_code == 200:
            servers = response.json()["servers"]
            return UUID(servers[0]["id"]) if servers else None
        await asyncio.sleep(BACKOFF)
    return None


@dataclass
class Boots:
    """What :func:`boot_many` saw: accepted servers and every answer, by kind."""

    accepted: set[UUID] = field(default_factory=set)
    #: Every answer to a create (a 503 retried is counted each time).
    answers: dict[str, int] = field(default_factory=dict)
    probes: list[Probe] = field(default_factory=list)
    #: The status each client last saw of the server it created.
    seen: dict[UUID, str] = field(default_factory=dict)
    #: Boots finished: accepted, or refused otherwise than by a 503.
    done: int = 0


async def boot_many(
    api_urls: Sequence[str],
    token: str,
    into: Boots,
    *,
    boots: int,
    clients: int,
    prefix: str = "ha",
) -> None:
    """``boots`` creates from ``clients`` clients at once, recorded ``into`` as they are
    answered. Each client waits for its server to be ACTIVE or ERROR before the next
    create, so the boots spread over time as users' do. A create answered 503 is sent
    again after a pause, as its ``Retry-After`` asks: keel promises that a 503 leaves no
    server behind."""
    pending = iter(range(boots))
    began = time.monotonic()

    async def one_client() -> None:
        client = ApiClient(api_urls, token, lambda: time.monotonic() - began)
        try:
            for index in pending:
                deadline = time.monotonic() + WAIT_TIMEOUT
                while True:
                    answer, server = await create(client, f"{prefix}-{index}")
                    into.answers[answer] = into.answers.get(answer, 0) + 1
                    if answer != "503" or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(BACKOFF)
                into.done += 1
                if server is not None:
                    into.accepted.add(server)
                    into.seen[server] = await settled(client, server)
        finally:
            into.probes.extend(client.probes)
            await client.close()

    await asyncio.gather(*(one_client() for _ in range(clients)))


async def settled(client: ApiClient, server: UUID) -> str:
    """Poll until the server is ACTIVE or ERROR (or gone); that status, or ``timeout``."""
    deadline = time.monotonic() + WAIT_TIMEOUT
    while time.monotonic() < deadline:
        try:
            response = await client.request("GET", f"servers/{server}")
        except (httpx.HTTPError, Unanswered):
            response = None
        if response is not None and response.status_code == 404:
            return "gone"
        if response is not None and response.status_code == 200:
            status = str(response.json()["server"]["status"])
            if status in ("ACTIVE", "ERROR"):
                return status
        await asyncio.sleep(POLL)
    return "timeout"


class BootAndDelete:
    """Clients running boot-and-delete until :meth:`stop` (see the module docstring)."""

    def __init__(self, api_urls: Sequence[str], token: str, clients: int) -> None:
        self.api_urls = api_urls
        self.token = token
        self.clients = clients
        self.began = time.monotonic()
        self.accepted: set[UUID] = set()
        self.deleted: set[UUID] = set()
        self.iterations: list[Iteration] = []
        self.probes: list[Probe] = []
        self._stopping = asyncio.Event()
        self._count = itertools.count()

    def clock(self) -> float:
        """Seconds since the clients were made."""
        return time.monotonic() - self.began

    def stop(self) -> None:
        """Let every client finish the iteration it is in, then return."""
        self._stopping.set()

    async def run(self) -> None:
        await asyncio.gather(*(self._client() for _ in range(self.clients)))

    async def _client(self) -> None:
        client = ApiClient(self.api_urls, self.token, self.clock)
        try:
            while not self._stopping.is_set():
                started = self.clock()
                failure = await self._iteration(client)
                self.iterations.append(Iteration(started, self.clock(), not failure, failure))
                if failure:
                    await asyncio.sleep(BACKOFF)
        finally:
            self.probes.extend(client.probes)
            await client.close()

    async def _iteration(self, client: ApiClient) -> str:
        """One boot-and-delete; what failed first, or ``""``."""
        answer, server = await create(client, f"bd-{next(self._count)}")
        if server is None:
            return f"create {answer}"
        self.accepted.add(server)
        failures: list[str] = [] if answer == "202" else [f"create {answer}"]
        status = await self._wait(client, server, ("ACTIVE", "ERROR"), failures)
        if status != "ACTIVE":
            failures.append(f"server {status}")
        deadline = time.monotonic() + WAIT_TIMEOUT
        while time.monotonic() < deadline:
            try:
                response = await client.request("DELETE", f"servers/{server}")
            except (httpx.HTTPError, Unanswered) as exc:
                failures.append(f"delete {type(exc).__name__}")
            else:
                if response.status_code in (204, 404):
                    break
                failures.append(f"delete {response.status_code}")
            await asyncio.sleep(BACKOFF)
        if await self._wait(client, server, ("gone",), failures) == "gone":
            self.deleted.add(server)
        return failures[0] if failures else ""

    async def _wait(
        self, client: ApiClient, server: UUID, wanted: tuple[str, ...], failures: list[str]
    ) -> str:
        """Poll the server until its status is one of ``wanted`` (``gone``: 404)."""
        deadline = time.monotonic() + WAIT_TIMEOUT
        while time.monotonic() < deadline:
            try:
                response = await client.request("GET", f"servers/{server}")
            except (httpx.HTTPError, Unanswered) as exc:
                failures.append(f"show {type(exc).__name__}")
            else:
                if response.status_code == 404:
                    status = "gone"
                elif response.status_code == 200:
                    status = str(response.json()["server"]["status"])
                else:
                    failures.append(f"show {response.status_code}")
                    status = ""
                if status in wanted or status == "gone":
                    return status
            await asyncio.sleep(POLL)
        return "timeout"
