"""A whole keel cloud for end-to-end tests: real processes, real broker, real database.

:func:`running_cloud` takes a migrated copy of the run's template database (see
:mod:`devkit.database`) and registers the ``cirros`` image, picks an exchange no one else
uses, starts keel-conductor, the schedulers, the compute agents and keel-api from their
console scripts (a :class:`devkit.processes.ProcessGroup`), writes a ``clouds.yaml`` for
the stock ``openstack`` client, and waits until every service reports up. On the way out
every process gets SIGTERM, a bounded wait, then SIGKILL, and the database is dropped.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

from devkit import CIRROS_ID
from devkit.broker import remove_exchange
from devkit.database import Scratch, scratch
from devkit.environment import clean_environ, keel_env
from devkit.processes import BIN, Process, ProcessGroup
from devkit.readiness import api_answers, free_port, up_services, wait_until
from devkit.servers import AMQP_URL, PG_SERVER
from shared.config import DatabaseSettings
from shared.db import images
from shared.db.pool import create_pool
from tests.faults.proxy import url_through

__all__ = [
    "ADMIN",
    "BIN",
    "CIRROS_ID",
    "MEMBER",
    "PG_SERVER",
    "Cloud",
    "CloudConfig",
    "CloudError",
    "Process",
    "free_port",
    "running_cloud",
]

CONTROLLER = "controller"
READY_TIMEOUT = 60.0
CLI_TIMEOUT = 120.0

ADMIN = {"user_id": "admin", "project_id": "admin-project", "roles": ["admin", "member"]}
MEMBER = {"user_id": "demo", "project_id": "demo-project", "roles": ["member"]}


#: A fence lease longer than any outage a test causes: no host is fenced by one.
OUTAGE_LEASE = 60.0


#: The secret a test cloud's keel-api and conductors sign image URLs with.
IMAGE_URL_SECRET = "e2e-image-url-secret-not-for-production"


class CloudError(Exception):
    """The cloud could not be started; the message carries the processes' logs."""


@dataclass(frozen=True)
class CloudConfig:
    schedulers: int = 1
    computes: tuple[str, ...] = ("compute1", "compute2")
    #: ``KEEL_COMPUTE__*`` settings of every agent, so capacity is known.
    vcpus: int = 4
    memory_mb: int = 8192
    local_gb: int = 100
    service_down_time: int = 4
    #: ``HOST:PORT`` the processes reach PostgreSQL at instead of the server's own
    #: address: a :class:`~tests.faults.proxy.TcpProxy` a test can cut.
    database_address: str | None = None
    #: The same for RabbitMQ: ``HOST:PORT`` of a proxy every process reaches it through.
    broker_address: str | None = None
    #: A password written into the processes' database URL (the test server trusts
    #: local connections and ignores it), so a test can look for it in the logs.
    database_password: str | None = None
    #: Extra ``KEEL_*`` settings of every process.
    env: tuple[tuple[str, str], ...] = ()
    #: Agents' ``KEEL_FENCING__SELF_FENCE_AFTER``, the lease of each host's fence: short,
    #: so that a host forced down is evacuated seconds later (its evacuation waits for the
    #: lease); the outage tests, whose cuts last longer, set a long one
    #: (:data:`OUTAGE_LEASE`).
    self_fence_after: float = 10.0
    #: ``KEEL_FENCING__MARGIN`` of every process (the fence looks twice a second here).
    fence_margin: float = 1.0


@dataclass
class Cloud:
    config: CloudConfig
    workdir: Path
    database_url: str
    exchange: str
    api_url: str
    admin_token: str
    member_token: str
    pool: asyncpg.Pool
    group: ProcessGroup
    #: The environment every keel process of this cloud starts with.
    env: dict[str, str] = field(default_factory=dict)

    @property
    def processes(self) -> dict[str, Process]:
        """The cloud's processes by name, in start order."""
        return self.group.processes

    @property
    def clouds_yaml(self) -> Path:
        return self.workdir / "clouds.yaml"

    def state_dir(self, host: str) -> Path:
        return self.workdir / "state" / host

    def openstack(self, *args: str, cloud: str = "keel", as_json: bool = True) -> Any:
        """Run the real ``openstack`` CLI; parse its JSON output; fail with its stderr."""
        result = self.openstack_raw(*args, cloud=cloud, as_json=as_json)
        if result.returncode != 0:
            raise AssertionError(
                f"openstack {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return json.loads(result.stdout) if as_json else result.stdout

    def openstack_raw(
        self, *args: str, cloud: str = "keel", as_json: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = clean_environ()
        env["OS_CLIENT_CONFIG_FILE"] = str(self.clouds_yaml)
        argv = [str(BIN / "openstack"), "--os-cloud", cloud, *args]
        if as_json:
            argv += ["-f", "json"]
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False
        )

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``keel-manage`` with this cloud's settings."""
        return subprocess.run(
            [str(BIN / "keel-manage"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            check=False,
        )

    def http(self, token: str | None = None) -> httpx.AsyncClient:
        """An HTTP client for the compute API (base ``/v2.1/``) with ``token`` if given."""
        headers = {"X-Auth-Token": token} if token else {}
        return httpx.AsyncClient(base_url=self.api_url + "/v2.1/", headers=headers, timeout=30)

    async def get(self, path: str, version: str = "2.53") -> Any:
        """GET a compute API path as the admin at ``version``; its JSON body."""
        headers = {"OpenStack-API-Version": f"compute {version}"}
        async with self.http(self.admin_token) as http:
            response = await http.get(path, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()

    async def post_server(
        self, name: str, *, zone: str | None = None, host: str | None = None
    ) -> dict[str, Any]:
        """Ask the admin's API for an m1.tiny cirros server; its 202 body's ``server``.

        ``host`` places it on that host (microversion 2.74's requested destination: the
        scheduler's filters still apply).
        """
        body: dict[str, Any] = {"name": name, "flavorRef": "1", "imageRef": str(CIRROS_ID)}
        headers = {}
        if zone is not None:
            body["availability_zone"] = zone
        if host is not None:
            body["host"] = host
            headers["OpenStack-API-Version"] = "compute 2.74"
        async with self.http(self.admin_token) as http:
            created = await http.post("servers", json={"server": body}, headers=headers)
        assert created.status_code == 202, created.text
        server: dict[str, Any] = created.json()["server"]
        return server

    async def create_server(
        self, name: str, zone: str | None = None, *, host: str | None = None
    ) -> dict[str, Any]:
        """Create a server as :meth:`post_server` does; wait (polling) until it is ACTIVE."""
        path = f"servers/{(await self.post_server(name, zone=zone, host=host))['id']}"
        shown: dict[str, Any] = {}
        async with self.http(self.admin_token) as http:

            async def settled() -> bool:
                nonlocal shown
                shown = (await http.get(path)).json()["server"]
                return shown["status"] in ("ACTIVE", "ERROR")

            await wait_until(settled, what=f"server {name} settling", timeout=READY_TIMEOUT)
        assert shown["status"] == "ACTIVE", shown
        return shown

    async def delete_server(self, server_id: str) -> None:
        """Delete a server as the admin; wait (polling) until it is gone."""
        async with self.http(self.admin_token) as http:
            response = await http.delete(f"servers/{server_id}")
            assert response.status_code == 204, response.text

            async def gone() -> bool:
                return (await http.get(f"servers/{server_id}")).status_code == 404

            await wait_until(gone, what=f"deleting server {server_id}", timeout=READY_TIMEOUT)

    def logs(self) -> dict[str, str]:
        """Every process's whole log so far."""
        return {name: p.read_log() for name, p in self.processes.items()}

    def log_tails(self) -> list[tuple[str, str]]:
        return [(name, p.tail()) for name, p in self.processes.items()]

    def start(self, name: str, binary: str, host: str = CONTROLLER, **env: str) -> Process:
        """Start one more process (or start a stopped one again under its name)."""
        settings = {**self.env, "KEEL_HOST": host, **env}
        if binary == "keel-compute":
            state = self.state_dir(host)
            state.mkdir(parents=True, exist_ok=True)
            settings.setdefault("KEEL_STATE_DIR", str(state))
        return self.group.start(name, [binary], settings)

    def agent_env(self, host: str, state_dir: Path, **settings: str) -> dict[str, str]:
        """An agent's environment: the cloud's, with its host, state dir and ``settings``."""
        return {**self.env, "KEEL_HOST": host, "KEEL_STATE_DIR": str(state_dir), **settings}

    def start_agent(
        self, name: str, host: str, state_dir: Path, *args: str, **settings: str
    ) -> Process:
        """Start a keel-compute (``args`` after the binary, e.g. ``--config FILE``)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        return self.group.start(
            name, ["keel-compute", *args], self.agent_env(host, state_dir, **settings)
        )

    def run_agent(
        self,
        host: str,
        state_dir: Path,
        *args: str,
        timeout: float = READY_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> tuple[int | None, str]:
        """Start a keel-compute expected to exit by itself: its exit code and its log.

        ``None`` if it was still running after ``timeout`` seconds (it is then stopped).
        """
        name = f"run-{uuid.uuid4().hex[:8]}"
        process = self.start_agent(name, host, state_dir, *args, **(env or {}))
        try:
            code: int | None = process.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            process.stop()
            code = None
        del self.processes[name]
        return code, process.read_log()

    async def wait_for_service(self, host: str, *, up: bool, binary: str = "keel-compute") -> None:
        """Until the service of ``binary`` on ``host`` is up (or down)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while ((binary, host) in await self.up_services()) != up:
            if time.monotonic() > deadline:
                raise CloudError(
                    f"{binary} on {host} not {'up' if up else 'down'}\n{self.describe()}"
                )
            await asyncio.sleep(0.25)

    async def dump(self, *, compute_services_only: bool = True) -> dict[str, list[str]]:
        """services, compute_nodes, instances and allocations, every row as JSON text.

        Conductors and schedulers stamp their own service rows with heartbeats, so by
        default only compute services are dumped.
        """
        where = {"services": "WHERE \"binary\" = 'keel-compute'" if compute_services_only else ""}
        async with self.pool.acquire() as conn:
            return {
                table: [
                    row[0]
                    for row in await conn.fetch(
                        f"SELECT to_jsonb(t)::text FROM {table} t {where.get(table, '')} "
                        "ORDER BY id"
                    )
                ]
                for table in ("services", "compute_nodes", "instances", "allocations")
            }

    async def up_services(self) -> set[tuple[str, str]]:
        """``(binary, host)`` of every service the database considers up."""
        async with self.pool.acquire() as conn:
            return await up_services(conn, self.config.service_down_time)

    def describe(self) -> str:
        """Every process's exit code and log tail."""
        return self.group.describe()

    def stop_all(self) -> None:
        self.group.stop_all()


def clouds_yaml(api_url: str, admin_token: str, member_token: str) -> str:
    def cloud(token: str) -> str:
        return (
            "    auth_type: admin_token\n"
            f"    auth: {{endpoint: '{api_url}/v2.1/', token: '{token}'}}\n"
            "    identity_api_version: 3\n"
            f"    identity_endpoint_override: '{api_url}/v2.1/'\n"
            f"    image_endpoint_override: '{api_url}/image/'\n"
            f"    network_endpoint_override: '{api_url}/network/'\n"
            "    region_name: RegionOne\n"
        )

    return f"clouds:\n  keel:\n{cloud(admin_token)}  keel-member:\n{cloud(member_token)}"


async def register_image(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await images.create(conn, image_id=CIRROS_ID, name="cirros", min_disk=1)


def process_database_url(cloud: Cloud) -> str:
    """The database URL the keel processes get (see ``CloudConfig``)."""
    config = cloud.config
    url = cloud.database_url
    if config.database_address is not None:
        url = url_through(url, config.database_address)
    if config.database_password is not None:
        parts = urlsplit(url)
        user = parts.username or "postgres"
        netloc = f"{user}:{config.database_password}@{parts.netloc.rpartition('@')[2]}"
        url = urlunsplit(parts._replace(netloc=netloc))
    return url


def process_env(cloud: Cloud, tokens: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    config = cloud.config
    return keel_env(
        database_url=process_database_url(cloud),
        transport_url=(
            AMQP_URL
            if config.broker_address is None
            else url_through(AMQP_URL, config.broker_address)
        ),
        exchange=cloud.exchange,
        api_bind=cloud.api_url.removeprefix("http://"),
        tokens=tokens,
        host=CONTROLLER,
        service_down_time=config.service_down_time,
        vcpus=config.vcpus,
        memory_mb=config.memory_mb,
        local_gb=config.local_gb,
        extra={
            "KEEL_FENCING__SELF_FENCE_AFTER": f"{config.self_fence_after:g}",
            "KEEL_FENCING__MARGIN": f"{config.fence_margin:g}",
            # Signed image URLs (server snapshots' uploads, builds' downloads) and a store
            # of the cloud's own.
            "KEEL_IMAGES__URL_SECRET": IMAGE_URL_SECRET,
            "KEEL_IMAGES__STORE_DIR": str(cloud.workdir / "image-store"),
            **dict(config.env),
        },
    )


def start_all(cloud: Cloud) -> None:
    """Start in dependency order: conductor, schedulers, agents, API."""
    cloud.start("conductor", "keel-conductor")
    for i in range(1, cloud.config.schedulers + 1):
        host = CONTROLLER if i == 1 else f"{CONTROLLER}-{i}"
        cloud.start(f"scheduler{i}", "keel-scheduler", host)
    for host in cloud.config.computes:
        cloud.start(host, "keel-compute", host)
    cloud.start("api", "keel-api")


async def wait_until_ready(cloud: Cloud) -> None:
    expected = {(p.binary, p.host) for p in cloud.processes.values() if p.binary != "keel-api"}
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        dead = [p.name for p in cloud.group.dead()]
        if dead:
            raise CloudError(f"{', '.join(dead)} exited during start-up\n{cloud.describe()}")
        missing = expected - await cloud.up_services()
        if not missing and await asyncio.to_thread(api_answers, cloud.api_url):
            return
        if time.monotonic() > deadline:
            raise CloudError(
                f"not ready after {READY_TIMEOUT:.0f}s (not up: {sorted(missing)})\n"
                + cloud.describe()
            )
        await asyncio.sleep(0.25)


@asynccontextmanager
async def running_cloud(
    workdir: Path, config: CloudConfig | None = None, databases: Scratch | None = None
) -> AsyncIterator[Cloud]:
    """A cloud on a migrated copy of ``databases``' template (a scratch run of its own if
    not given); stopped and removed afterwards."""
    if databases is None:
        async with scratch(PG_SERVER) as own, running_cloud(workdir, config, own) as cloud:
            yield cloud
        return
    config = config or CloudConfig()
    database_url = await databases.migrated("e2e")
    pool = await create_pool(database_url, DatabaseSettings(pool_max_size=4, connect_timeout=5))
    admin_token, member_token = f"admin-{uuid.uuid4().hex}", f"member-{uuid.uuid4().hex}"
    cloud = Cloud(
        config=config,
        workdir=workdir,
        database_url=database_url,
        exchange=f"keel-e2e-{uuid.uuid4().hex[:12]}",
        api_url=f"http://127.0.0.1:{free_port()}",
        admin_token=admin_token,
        member_token=member_token,
        pool=pool,
        group=ProcessGroup(workdir / "logs"),
    )
    try:
        await register_image(pool)
        cloud.clouds_yaml.write_text(clouds_yaml(cloud.api_url, admin_token, member_token))
        cloud.env = process_env(cloud, {admin_token: ADMIN, member_token: MEMBER})
        start_all(cloud)
        await wait_until_ready(cloud)
        yield cloud
    finally:
        await asyncio.to_thread(cloud.stop_all)
        await pool.close()
        await databases.drop(database_url)
        await remove_exchange(cloud.exchange)
