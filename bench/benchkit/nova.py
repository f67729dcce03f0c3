"""A Nova control plane from PyPI on this machine, for the side-by-side benchmark.

What :func:`nova_cloud` stands up, every piece from ``bench/nova-requirements.txt`` in a
virtualenv of its own (``make rally-nova`` builds ``.nova-venv``):

* Keystone (fernet tokens, bcrypt passwords: its defaults), under gunicorn;
* Glance (file store in the work directory) with one image, ``cirros``, under gunicorn;
* Placement, under gunicorn;
* nova-api under gunicorn, one nova-conductor (a single cell: it serves cell0 and cell1
  as one), one nova-scheduler, and ``hosts`` nova-compute processes with
  ``compute_driver = fake.FakeDriver``, each a host of its own;
* no Neutron: :mod:`benchkit.network_stub` answers the few reads Nova makes of it
  (a server with no network still has its ports looked up on delete) with nothing.

The databases are fresh ones on the machine's MariaDB (``127.0.0.1:3306``, ``root``
without a password, through its ``mysql`` client), named after the run; the services
share a RabbitMQ virtual host of their own, made and deleted through the broker's
management API. On the way out every process (and everything it started) is stopped,
the databases are dropped and the virtual host is deleted, whatever happened.
Nova's services run as Nova 34 ships them: native threads, no eventlet.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devkit.processes import Process, ProcessGroup
from devkit.readiness import free_port

MYSQL = ("mysql", "--user=root", "--host=127.0.0.1", "--port=3306", "--batch")
RABBIT_MANAGEMENT = "http://127.0.0.1:15672/api"
RABBIT_USER = ("guest", "guest")
READY_TIMEOUT = 180.0
#: The databases of one run, by role.
DATABASES = ("keystone", "glance", "placement", "nova_api", "nova_cell0", "nova")
#: The Nova services that are WSGI applications, their module and gunicorn's workers.
WSGI_WORKERS = {"keystone": 2, "glance": 1, "placement": 1, "nova-api": 2}
NETWORK_STUB = Path(__file__).with_name("network_stub.py")
#: A service's WSGI module under gunicorn: Keystone and Nova read ``sys.argv`` as
#: their own options and refuse gunicorn's.
WSGI_SHIM = """\
import sys

sys.argv = sys.argv[:1]

from {module} import application  # noqa: E402,F401
"""


class NovaError(Exception):
    """The Nova control plane could not be set up; the message carries the log."""


@dataclass
class NovaCloud:
    venv: Path
    workdir: Path
    hosts: int
    run: str = field(default_factory=lambda: f"nova{secrets.token_hex(4)}")
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    ports: dict[str, int] = field(default_factory=dict)
    group: ProcessGroup = field(init=False)

    def __post_init__(self) -> None:
        self.group = ProcessGroup(self.workdir / "logs", stop_timeout=5)
        for name in ("keystone", "glance", "placement", "nova-api", "network"):
            self.ports[name] = free_port()

    # Where things are.

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    @property
    def auth_url(self) -> str:
        return f"{self.url('keystone')}/v3"

    def database(self, role: str) -> str:
        return f"{self.run}_{role}"

    def connection(self, role: str) -> str:
        return f"mysql+pymysql://root@127.0.0.1:3306/{self.database(role)}?charset=utf8"

    @property
    def transport_url(self) -> str:
        return f"rabbit://guest:guest@127.0.0.1:5672/{self.run}"

    @property
    def processes(self) -> dict[str, Process]:
        return self.group.processes

    # Commands.

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
            "HOME": str(self.workdir),
            "LANG": "C.UTF-8",
            **extra,
        }

    def command(self, *argv: str, env: dict[str, str] | None = None) -> str:
        """Run one of the virtualenv's commands to its end; its output."""
        done = subprocess.run(
            [str(self.venv / "bin" / argv[0]), *argv[1:]],
            env=env or self.env(),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise NovaError(f"{' '.join(argv[:3])} failed:\n{(done.stdout + done.stderr)[-4000:]}")
        return done.stdout

    def gunicorn(self, name: str, module: str, env: dict[str, str]) -> Process:
        """``module``'s WSGI application under gunicorn, on the service's port."""
        shims = self.workdir / "wsgi"
        shims.mkdir(exist_ok=True)
        shim = f"{name.replace('-', '_')}_wsgi"
        (shims / f"{shim}.py").write_text(WSGI_SHIM.format(module=module))
        argv = [
            str(self.venv / "bin" / "gunicorn"),
            "--bind", f"127.0.0.1:{self.ports[name]}",
            "--workers", str(WSGI_WORKERS[name]),
            "--threads", "8",
            "--timeout", "120",
            "--graceful-timeout", "5",
            # Longer than any client leaves a pooled connection idle: with gunicorn's
            # 2 s, a request on a connection it is closing is reset (Rally's polls
            # failed so at concurrency 20).
            "--keep-alive", "300",
            "--chdir", str(shims),
            f"{shim}:application",
        ]  # fmt: skip
        return self.group.start(name, argv, env, cwd=self.workdir)

    def wait_answers(self, name: str, path: str = "/") -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url(name) + path, timeout=5).status_code < 500:
                    return
            process = self.processes[name]
            if process.exit_code() is not None or time.monotonic() > deadline:
                raise NovaError(f"{name} does not answer:\n{process.tail()}")
            time.sleep(0.3)

    def tails(self) -> str:
        return self.group.describe(lines=40)

    # Tearing down.

    def stop(self) -> None:
        """Every process and what it started: SIGTERM, a bounded wait, SIGKILL."""
        self.group.stop_all()
        for process in self.processes.values():
            process.signal_group(signal.SIGKILL)


def mysql(statement: str) -> None:
    subprocess.run([*MYSQL, "-e", statement], check=True, capture_output=True, timeout=120)


def create_databases(cloud: NovaCloud) -> None:
    for role in DATABASES:
        mysql(f"CREATE DATABASE `{cloud.database(role)}` CHARACTER SET utf8mb4")


def drop_databases(cloud: NovaCloud) -> None:
    for role in DATABASES:
        with contextlib.suppress(subprocess.SubprocessError):
            mysql(f"DROP DATABASE IF EXISTS `{cloud.database(role)}`")


def create_vhost(cloud: NovaCloud) -> None:
    with httpx.Client(base_url=RABBIT_MANAGEMENT, auth=RABBIT_USER, timeout=30) as http:
        http.put(f"/vhosts/{cloud.run}").raise_for_status()
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        http.put(f"/permissions/{cloud.run}/guest", json=everything).raise_for_status()


def delete_vhost(cloud: NovaCloud) -> None:
    with contextlib.suppress(httpx.HTTPError):
        httpx.delete(f"{RABBIT_MANAGEMENT}/vhosts/{cloud.run}", auth=RABBIT_USER, timeout=120)


# Configuration files.


def authtoken(cloud: NovaCloud, user: str) -> str:
    """The ``[keystone_authtoken]`` of a service whose Keystone user is ``user``."""
    return f"""\
[keystone_authtoken]
www_authenticate_uri = {cloud.auth_url}
auth_url = {cloud.auth_url}
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = {user}
password = {cloud.password}
"""


def service_auth(cloud: NovaCloud, section: str, user: str = "nova") -> str:
    """A ``[section]`` through which Nova reaches another service as ``user``."""
    return f"""\
[{section}]
auth_type = password
auth_url = {cloud.auth_url}
project_domain_name = Default
user_domain_name = Default
project_name = service
username = {user}
password = {cloud.password}
region_name = RegionOne
valid_interfaces = public
"""


def keystone_conf(cloud: NovaCloud) -> str:
    keys = cloud.workdir / "keystone"
    return f"""\
[database]
connection = {cloud.connection("keystone")}

[token]
provider = fernet

[fernet_tokens]
key_repository = {keys / "fernet-keys"}

[fernet_receipts]
key_repository = {keys / "fernet-keys"}

[credential]
key_repository = {keys / "credential-keys"}
"""


def glance_conf(cloud: NovaCloud) -> str:
    return f"""\
[DEFAULT]
enabled_backends = file:file
worker_self_reference_url = {cloud.url("glance")}

[database]
connection = {cloud.connection("glance")}

[glance_store]
default_backend = file

[file]
filesystem_store_datadir = {cloud.workdir / "glance" / "images"}

[os_glance_staging_store]
filesystem_store_datadir = {cloud.workdir / "glance" / "staging"}

[os_glance_tasks_store]
filesystem_store_datadir = {cloud.workdir / "glance" / "tasks"}

[paste_deploy]
flavor = keystone

{authtoken(cloud, "glance")}
"""


def placement_conf(cloud: NovaCloud) -> str:
    return f"""\
[placement_database]
connection = {cloud.connection("placement")}

[api]
auth_strategy = keystone

{authtoken(cloud, "placement")}
"""


def nova_conf(cloud: NovaCloud) -> str:
    state = cloud.workdir / "nova"
    return f"""\
[DEFAULT]
transport_url = {cloud.transport_url}
compute_driver = fake.FakeDriver
my_ip = 127.0.0.1
state_path = {state / "state"}
instances_path = {state / "instances"}

[api]
auth_strategy = keystone

[api_database]
connection = {cloud.connection("nova_api")}

[database]
connection = {cloud.connection("nova")}

[conductor]
workers = 1

[scheduler]
workers = 1

[oslo_concurrency]
lock_path = {state / "lock"}

[quota]
instances = -1
cores = -1
ram = -1

[wsgi]
api_paste_config = {state / "api-paste.ini"}

{authtoken(cloud, "nova")}
{service_auth(cloud, "placement")}
{service_auth(cloud, "glance")}
{service_auth(cloud, "neutron")}
endpoint_override = {cloud.url("network")}
"""


def compute_conf(cloud: NovaCloud, host: str) -> str:
    """What one nova-compute changes: its host name and its own state."""
    state = cloud.workdir / "nova" / host
    return f"""\
[DEFAULT]
host = {host}
state_path = {state}
instances_path = {state / "instances"}
"""


# Keystone's catalog and users.


class KeystoneAdmin:
    """Keystone's bootstrap admin over HTTP."""

    def __init__(self, cloud: NovaCloud) -> None:
        self.http = httpx.Client(base_url=cloud.auth_url, timeout=60)
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {
                        "user": {"name": "admin", "domain": {"id": "default"},
                                 "password": cloud.password}
                    },
                },
                "scope": {"project": {"name": "admin", "domain": {"id": "default"}}},
            }
        }  # fmt: skip
        response = self.http.post("/auth/tokens", json=body)
        if response.status_code != 201:
            raise NovaError(f"no admin token: {response.status_code} {response.text}")
        self.token = response.headers["X-Subject-Token"]
        self.http.headers["X-Auth-Token"] = self.token

    def make(self, kind: str, body: dict[str, Any]) -> str:
        response = self.http.post(f"/{kind}s", json={kind: body})
        if response.status_code != 201:
            raise NovaError(f"cannot create {kind}: {response.status_code} {response.text}")
        made: str = response.json()[kind]["id"]
        return made

    def role(self, name: str) -> str:
        found: str = self.http.get("/roles", params={"name": name}).json()["roles"][0]["id"]
        return found

    def close(self) -> None:
        self.http.close()


def register(cloud: NovaCloud, admin: KeystoneAdmin) -> None:
    """The ``service`` project, a user for each service, and the catalog."""
    service_project = admin.make("project", {"name": "service", "domain_id": "default"})
    admin_role = admin.role("admin")
    for user in ("nova", "placement", "glance"):
        user_id = admin.make(
            "user", {"name": user, "password": cloud.password, "domain_id": "default"}
        )
        path = f"/projects/{service_project}/users/{user_id}/roles/{admin_role}"
        admin.http.put(path).raise_for_status()
    catalog = (
        ("compute", "nova", f"{cloud.url('nova-api')}/v2.1"),
        ("placement", "placement", cloud.url("placement")),
        ("image", "glance", cloud.url("glance")),
    )
    for service_type, name, url in catalog:
        service = admin.make("service", {"type": service_type, "name": name})
        for interface in ("public", "internal", "admin"):
            admin.make(
                "endpoint",
                {"service_id": service, "interface": interface, "url": url,
                 "region_id": "RegionOne"},
            )  # fmt: skip


# Standing each service up.


def start_keystone(cloud: NovaCloud) -> None:
    directory = cloud.workdir / "keystone"
    directory.mkdir()
    conf = directory / "keystone.conf"
    conf.write_text(keystone_conf(cloud))
    env = cloud.env(OS_KEYSTONE_CONFIG_FILES=str(conf))
    user = ("--keystone-user", "root", "--keystone-group", "root")

    def manage(*args: str) -> None:
        cloud.command("keystone-manage", "--config-file", str(conf), *args, env=env)

    manage("db_sync")
    manage("fernet_setup", *user)
    manage("credential_setup", *user)
    # ``--option=value``: a random password may begin with "-" (argparse: an option).
    manage(
        "bootstrap",
        f"--bootstrap-password={cloud.password}",
        "--bootstrap-public-url", cloud.auth_url,
        "--bootstrap-internal-url", cloud.auth_url,
        "--bootstrap-admin-url", cloud.auth_url,
        "--bootstrap-region-id", "RegionOne",
    )  # fmt: skip
    cloud.gunicorn("keystone", "keystone.wsgi.api", env)
    cloud.wait_answers("keystone", "/v3")


def start_glance(cloud: NovaCloud, admin: KeystoneAdmin) -> None:
    directory = cloud.workdir / "glance"
    for sub in ("images", "staging", "tasks"):
        (directory / sub).mkdir(parents=True)
    (directory / "glance-api.conf").write_text(glance_conf(cloud))
    shutil.copy(cloud.venv / "etc" / "glance" / "glance-api-paste.ini", directory)
    conf = directory / "glance-api.conf"
    cloud.command("glance-manage", "--config-file", str(conf), "db_sync")
    cloud.gunicorn("glance", "glance.wsgi.api",
                   cloud.env(OS_GLANCE_CONFIG_DIR=str(directory)))  # fmt: skip
    cloud.wait_answers("glance")
    # The image the task boots: a few bytes (the fake driver never reads them).
    headers = {"X-Auth-Token": admin.token}
    body = {"name": "cirros", "disk_format": "raw", "container_format": "bare",
            "visibility": "public"}  # fmt: skip
    with httpx.Client(base_url=cloud.url("glance"), headers=headers, timeout=60) as http:
        response = http.post("/v2/images", json=body)
        if response.status_code != 201:
            raise NovaError(f"cannot create the image: {response.status_code} {response.text}")
        image = response.json()["id"]
        upload = http.put(
            f"/v2/images/{image}/file",
            content=b"not a disk",
            headers={"Content-Type": "application/octet-stream"},
        )
        if upload.status_code != 204:
            raise NovaError(f"cannot upload the image: {upload.status_code} {upload.text}")


def start_placement(cloud: NovaCloud) -> None:
    directory = cloud.workdir / "placement"
    directory.mkdir()
    (directory / "placement.conf").write_text(placement_conf(cloud))
    env = cloud.env(OS_PLACEMENT_CONFIG_DIR=str(directory))
    cloud.command(
        "placement-manage", "--config-file", str(directory / "placement.conf"), "db", "sync"
    )
    cloud.gunicorn("placement", "placement.wsgi.api", env)
    cloud.wait_answers("placement")


def start_nova(cloud: NovaCloud) -> None:
    directory = cloud.workdir / "nova"
    (directory / "lock").mkdir(parents=True)
    conf = directory / "nova.conf"
    conf.write_text(nova_conf(cloud))
    shutil.copy(cloud.venv / "etc" / "nova" / "api-paste.ini", directory)
    config = ("--config-file", str(conf))
    cloud.command("nova-manage", *config, "api_db", "sync")
    cloud.command("nova-manage", *config, "cell_v2", "map_cell0",
                  "--database_connection", cloud.connection("nova_cell0"))  # fmt: skip
    cloud.command("nova-manage", *config, "cell_v2", "create_cell", "--name", "cell1")
    cloud.command("nova-manage", *config, "db", "sync")
    env = cloud.env()
    cloud.group.start("nova-conductor", [str(cloud.venv / "bin" / "nova-conductor"), *config], env)
    cloud.group.start("nova-scheduler", [str(cloud.venv / "bin" / "nova-scheduler"), *config], env)
    for index in range(cloud.hosts):
        host = f"fake-{index:03d}"
        own = directory / f"{host}.conf"
        own.write_text(compute_conf(cloud, host))
        argv = [str(cloud.venv / "bin" / "nova-compute"), *config, "--config-file", str(own)]
        cloud.group.start(host, argv, env)
    api_env = cloud.env(
        OS_NOVA_CONFIG_DIR=str(directory), OS_NOVA_CONFIG_FILES="api-paste.ini;nova.conf"
    )
    cloud.gunicorn("nova-api", "nova.wsgi.osapi_compute", api_env)
    cloud.wait_answers("nova-api")


def wait_hosts(cloud: NovaCloud, admin: KeystoneAdmin) -> None:
    """Every nova-compute up and mapped into cell1, as ``discover_hosts`` does."""
    conf = str(cloud.workdir / "nova" / "nova.conf")
    headers = {"X-Auth-Token": admin.token}
    deadline = time.monotonic() + READY_TIMEOUT
    with httpx.Client(
        base_url=f"{cloud.url('nova-api')}/v2.1", headers=headers, timeout=60
    ) as http:
        while True:
            cloud.command("nova-manage", "--config-file", conf, "cell_v2", "discover_hosts")
            services = http.get("/os-services", params={"binary": "nova-compute"}).json()
            up = [s for s in services.get("services", []) if s["state"] == "up"]
            hypervisors = http.get("/os-hypervisors").json().get("hypervisors", [])
            if len(up) >= cloud.hosts and len(hypervisors) >= cloud.hosts:
                break
            dead = cloud.group.dead()
            if dead or time.monotonic() > deadline:
                raise NovaError(f"{len(up)} of {cloud.hosts} computes up\n{cloud.tails()}")
            time.sleep(2)
        flavor = {"flavor": {"name": "m1.tiny", "id": "1", "ram": 512, "vcpus": 1, "disk": 1}}
        response = http.post("/flavors", json=flavor)
        if response.status_code != 200:
            raise NovaError(f"cannot create m1.tiny: {response.status_code} {response.text}")


def stand_up(cloud: NovaCloud) -> None:
    cloud.workdir.mkdir(parents=True)
    create_databases(cloud)
    create_vhost(cloud)
    network = [sys.executable, str(NETWORK_STUB), str(cloud.ports["network"])]
    cloud.group.start("network-stub", network, cloud.env())
    start_keystone(cloud)
    admin = KeystoneAdmin(cloud)
    try:
        register(cloud, admin)
        start_glance(cloud, admin)
        start_placement(cloud)
        start_nova(cloud)
        wait_hosts(cloud, admin)
    finally:
        admin.close()


@contextlib.contextmanager
def nova_cloud(venv: Path, workdir: Path, hosts: int) -> Iterator[NovaCloud]:
    """A Nova control plane on fresh databases; taken down again on the way out."""
    shutil.rmtree(workdir, ignore_errors=True)
    cloud = NovaCloud(venv=venv, workdir=workdir, hosts=hosts)
    try:
        stand_up(cloud)
        yield cloud
    finally:
        cloud.stop()
        drop_databases(cloud)
        delete_vhost(cloud)
