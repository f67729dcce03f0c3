"""A real Keystone for the tests: from PyPI, on a scratch PostgreSQL database, under gunicorn.

Keystone runs from a virtualenv of its own (``make test-keystone`` builds it from
``tests/keystone/requirements.txt``; ``KEEL_KEYSTONE_VENV`` names it). :func:`running_keystone`
writes a ``keystone.conf`` (the database, fernet and credential keys in the work
directory, no cache) and a WSGI module, runs ``keystone-manage db_sync``, ``fernet_setup``,
``credential_setup`` and ``bootstrap`` (user ``admin`` in project ``admin``, region
``RegionOne``), starts Keystone's public application under gunicorn on 127.0.0.1 and
waits until it answers. :meth:`Keystone.stop` and :meth:`Keystone.start` take it away
and bring it back on the same port (an outage), and on the way out it is stopped.
:class:`Admin` is its admin's HTTP client, used to make keel's service user, the catalog
entries, users and projects as an operator would.
"""

from __future__ import annotations

import getpass
import grp
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devkit.database import Scratch
from devkit.processes import Process, ProcessGroup
from devkit.readiness import free_port

READY_TIMEOUT = 60.0
#: keel's services in the catalog: type, name, and the path under keel-api's URL.
KEEL_SERVICES = (
    ("compute", "nova", "/v2.1/"),
    ("image", "glance", "/image/"),
    ("network", "neutron", "/network/"),
)


class KeystoneError(Exception):
    """Keystone could not be set up or started; the message carries its log."""


@dataclass
class Keystone:
    venv: Path
    workdir: Path
    url: str
    admin_password: str
    group: ProcessGroup
    process: Process | None = None

    @property
    def v3(self) -> str:
        return f"{self.url}/v3"

    @property
    def conf(self) -> Path:
        return self.workdir / "keystone.conf"

    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
            "OS_KEYSTONE_CONFIG_FILES": str(self.conf),
            "HOME": str(self.workdir),
        }

    def manage(self, *args: str) -> None:
        done = subprocess.run(
            [str(self.venv / "bin" / "keystone-manage"), "--config-file", str(self.conf), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise KeystoneError(f"keystone-manage {args[0]} failed:\n{done.stderr[-4000:]}")

    def start(self) -> None:
        """gunicorn serving Keystone on its port; returns once it answers."""
        port = self.url.rpartition(":")[2]
        argv = [
            str(self.venv / "bin" / "gunicorn"),
            "--bind", f"127.0.0.1:{port}",
            "--workers", "1",
            "--threads", "8",
            "--timeout", "120",
            "--graceful-timeout", "2",
            "--chdir", str(self.workdir),
            "keystone_wsgi:application",
        ]  # fmt: skip
        self.process = self.group.start("keystone", argv, self.env(), cwd=self.workdir)
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.answers():
            if self.process.exit_code() is not None or time.monotonic() > deadline:
                raise KeystoneError(f"Keystone did not start:\n{self.process.tail()}")
            time.sleep(0.25)

    def stop(self) -> None:
        """Take Keystone away (its port then refuses connections)."""
        if self.process is not None:
            self.process.stop()

    def answers(self) -> bool:
        try:
            return httpx.get(self.v3, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def keystone_conf(workdir: Path, database_url: str) -> str:
    connection = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    return f"""\
[DEFAULT]
log_file = {workdir / "keystone.log"}

[database]
connection = {connection}

[token]
provider = fernet
expiration = 3600

[fernet_tokens]
key_repository = {workdir / "fernet-keys"}

[fernet_receipts]
key_repository = {workdir / "fernet-keys"}

[credential]
key_repository = {workdir / "credential-keys"}

[cache]
enabled = false
"""


#: Keystone's WSGI application, without gunicorn's command line: Keystone reads
#: ``sys.argv`` as its own options and refuses gunicorn's.
WSGI_MODULE = """\
import sys

sys.argv = sys.argv[:1]

from keystone.server import wsgi

application = wsgi.initialize_public_application()
"""


def set_up(keystone: Keystone, database_url: str) -> None:
    """Configuration, schema, keys and the bootstrap admin (and its catalog entry)."""
    keystone.conf.write_text(keystone_conf(keystone.workdir, database_url))
    (keystone.workdir / "keystone_wsgi.py").write_text(WSGI_MODULE)
    user = getpass.getuser()
    group = grp.getgrgid(os.getgid()).gr_name
    keystone.manage("db_sync")
    keystone.manage("fernet_setup", "--keystone-user", user, "--keystone-group", group)
    keystone.manage("credential_setup", "--keystone-user", user, "--keystone-group", group)
    # ``--option=value``: a random password may begin with "-", which argparse would
    # take for an option of its own.
    keystone.manage(
        "bootstrap",
        f"--bootstrap-password={keystone.admin_password}",
        "--bootstrap-admin-url", keystone.v3,
        "--bootstrap-public-url", keystone.v3,
        "--bootstrap-internal-url", keystone.v3,
        "--bootstrap-region-id", "RegionOne",
    )  # fmt: skip


@asynccontextmanager
async def running_keystone(
    venv: Path, workdir: Path, databases: Scratch
) -> AsyncIterator[Keystone]:
    database_url = await databases.empty("keystone")
    keystone = Keystone(
        venv=venv,
        workdir=workdir,
        url=f"http://127.0.0.1:{free_port()}",
        # Always beginning with "-", as a random one may: passed to keystone-manage, it
        # must not be taken for an option.
        admin_password="-" + secrets.token_urlsafe(18),
        group=ProcessGroup(workdir / "logs"),
    )
    try:
        set_up(keystone, database_url)
        keystone.start()
        yield keystone
    finally:
        keystone.group.stop_all()
        await databases.drop(database_url)


class Admin:
    """Keystone's bootstrap admin, over HTTP: what an operator does with ``openstack``."""

    def __init__(self, keystone: Keystone) -> None:
        self.keystone = keystone
        self.http = httpx.Client(base_url=keystone.v3, timeout=30)
        self.http.headers["X-Auth-Token"] = self.token("admin", keystone.admin_password, "admin")

    def close(self) -> None:
        self.http.close()

    def token(self, user: str, password: str, project: str) -> str:
        """A project-scoped token for ``user`` (by name, in the Default domain)."""
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {
                        "user": {"name": user, "domain": {"id": "default"}, "password": password}
                    },
                },
                "scope": {"project": {"name": project, "domain": {"id": "default"}}},
            }
        }
        response = httpx.post(f"{self.keystone.v3}/auth/tokens", json=body, timeout=30)
        if response.status_code != 201:
            raise KeystoneError(f"no token for {user}: {response.status_code} {response.text}")
        return response.headers["X-Subject-Token"]

    def _made(self, kind: str, body: dict[str, Any]) -> str:
        response = self.http.post(f"/{kind}s", json={kind: body})
        if response.status_code != 201:
            raise KeystoneError(f"cannot create {kind}: {response.status_code} {response.text}")
        made: str = response.json()[kind]["id"]
        return made

    def role_id(self, name: str) -> str:
        roles = self.http.get("/roles", params={"name": name}).json()["roles"]
        found: str = roles[0]["id"]
        return found

    def member(self, user: str, password: str, project: str, role: str = "member") -> str:
        """A project and a user with ``role`` there; the user's id."""
        project_id = self._made("project", {"name": project, "domain_id": "default"})
        user_id = self._made(
            "user", {"name": user, "password": password, "domain_id": "default",
                     "default_project_id": project_id}
        )  # fmt: skip
        path = f"/projects/{project_id}/users/{user_id}/roles/{self.role_id(role)}"
        if self.http.put(path).status_code != 204:
            raise KeystoneError(f"cannot grant {role} to {user} on {project}")
        return user_id

    def register_keel(self, api_url: str, region: str = "RegionOne") -> None:
        """keel's catalog entries: compute, image and network, at keel-api's URL."""
        for service_type, name, path in KEEL_SERVICES:
            service_id = self._made("service", {"type": service_type, "name": name})
            for interface in ("public", "internal", "admin"):
                self._made(
                    "endpoint",
                    {"service_id": service_id, "interface": interface,
                     "url": api_url + path, "region_id": region},
                )  # fmt: skip

    def revoke(self, token: str) -> None:
        response = self.http.delete("/auth/tokens", headers={"X-Subject-Token": token})
        if response.status_code != 204:
            raise KeystoneError(f"cannot revoke a token: {response.status_code}")
