"""Run a whole keel cloud on this machine, in the foreground: what ``make run`` does.

Steps: check that PostgreSQL and RabbitMQ answer (and say how to start them if not);
create and migrate the database (``keel-manage db sync``); register the ``cirros`` image
unless it is there; create the projects ``admin`` and ``demo`` with the users ``admin``
(admin) and ``demo`` (member) unless they are there, giving both a fresh password; make
fresh admin and member tokens for them and write the clouds (static-token and
password) to ``<workdir>/clouds.yaml``; start keel-conductor, keel-scheduler, two
keel-compute agents (hosts ``compute1`` and ``compute2``, state in ``<workdir>/compute1``
...) and keel-api, each logging to ``<workdir>/logs/``; wait until the API answers and
both agents are up; print how to use the cloud. Ctrl-C or SIGTERM stops every process
(SIGTERM, then SIGKILL after a bound) and exits 0. If a process dies, the tail of its
log is printed and the rest are stopped.

Before starting anything, it checks that the database's compute hosts ``compute1`` and
``compute2`` (if it has them) are this checkout's: their node identity files must be in
``<workdir>``. If not (another checkout ran a cloud on this database, or ``<workdir>``
was deleted), it says so, with the ways out, and exits 1. ``localcloud.py clean`` (what
``make clean`` runs) drops the database and ``<workdir>`` after printing what it
removes; it refuses while this checkout's cloud runs (see ``localstate.py``).

Settings come from the same ``KEEL_*`` variables as the services themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from localimages import build_guest, register_guest
from localstate import clean, explain_foreign, foreign_hosts, forget_pid, record_pid, running_pid

from devkit import CIRROS_ID, prerequisites
from devkit.fences import stop_fences, tag_this_run
from devkit.processes import BIN, Process, ProcessGroup
from devkit.readiness import api_answers, up_services
from services.manage.database import connect
from shared.config import Settings, load_settings
from shared.db import images, projects, role_assignments, roles, users
from shared.exceptions import ConfigError, ImageNotFound, KeelError, NotFound
from shared.objects.identity import ADMIN_ROLE, MEMBER_ROLE
from shared.passwords import hash_password

COMPUTE_HOSTS = ("compute1", "compute2")
READY_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0
LOG_TAIL_LINES = 25


def say(message: str) -> None:
    print(f"keel: {message}", flush=True)


# --- prerequisites ------------------------------------------------------------------


def check_prerequisites(settings: Settings) -> bool:
    """True if both servers answer; otherwise one line for each missing one, with the fix."""
    missing = prerequisites.for_cloud(settings)
    for found in missing:
        say(found.line())
    return not missing


def check_port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            say(
                f"cannot listen on {host}:{port} ({exc.strerror}): is another keel-api "
                "running? Stop it, or choose another address with KEEL_API_BIND."
            )
            return False
    return True


async def seed_image(database_url: str) -> bool:
    """Register the cirros image unless it exists; True if it was added."""
    async with connect(database_url) as conn:
        try:
            await images.get(conn, CIRROS_ID)
        except ImageNotFound:
            await images.create(conn, image_id=CIRROS_ID, name="cirros", min_disk=1)
            return True
    return False


# --- the users ----------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    """A user of the local cloud: their ids, password and static token."""

    user: str
    user_id: str
    project: str
    project_id: str
    #: The roles the user has in the project, implied ones included.
    roles: tuple[str, ...]
    password: str
    token: str


#: (user, project, role) of the local cloud's two users.
ACCOUNTS = (("admin", "admin", ADMIN_ROLE), ("demo", "demo", MEMBER_ROLE))


async def _account(database_url: str, user: str, project: str, role: str) -> Account:
    """Create the project and user unless they exist; give the user a fresh password."""
    password = secrets.token_urlsafe(18)
    async with connect(database_url) as conn:
        try:
            found_project = await projects.find(conn, project)
        except NotFound:
            found_project = await projects.create(conn, project, "created by make run")
        try:
            found_user = await users.find(conn, user)
            await users.set_password(conn, found_user, hash_password(password))
        except NotFound:
            found_user = await users.create(
                conn, user, hash_password(password), default_project_id=found_project.id
            )
        given = await roles.find(conn, role)
        await role_assignments.grant(conn, found_user.id, found_project.id, given.id)
        held = await roles.effective(conn, found_user.id, found_project.id)
    return Account(
        user=user,
        user_id=found_user.id,
        project=project,
        project_id=found_project.id,
        roles=tuple(r.name for r in held),
        password=password,
        token=secrets.token_urlsafe(24),
    )


async def ensure_accounts(database_url: str) -> list[Account]:
    return [await _account(database_url, *spec) for spec in ACCOUNTS]


# --- the client configuration --------------------------------------------------------

q = json.dumps  # a JSON string is a valid YAML scalar


def _token_cloud(api_url: str, token: str) -> list[str]:
    return [
        "    auth_type: admin_token",
        "    auth:",
        f"      endpoint: {q(api_url + '/v2.1/')}",
        f"      token: {q(token)}",
        "    identity_api_version: 3",
        f"    identity_endpoint_override: {q(api_url + '/identity/v3/')}",
        f"    image_endpoint_override: {q(api_url + '/image/')}",
        f"    network_endpoint_override: {q(api_url + '/network/')}",
        "    region_name: RegionOne",
    ]


def _password_cloud(api_url: str, account: Account) -> list[str]:
    return [
        "    auth_type: password",
        "    auth:",
        f"      auth_url: {q(api_url + '/identity/v3')}",
        f"      username: {q(account.user)}",
        f"      password: {q(account.password)}",
        f"      project_name: {q(account.project)}",
        "      user_domain_name: Default",
        "      project_domain_name: Default",
        "    identity_api_version: 3",
        "    region_name: RegionOne",
    ]


def write_clouds_yaml(path: Path, api_url: str, admin: Account, member: Account) -> None:
    lines = [
        "# Written by `make run`. Tokens and passwords are new on every run.",
        "clouds:",
        "  keel:",
        *_token_cloud(api_url, admin.token),
        "  keel-member:",
        *_token_cloud(api_url, member.token),
        "  keel-password:",
        *_password_cloud(api_url, admin),
        "  keel-password-member:",
        *_password_cloud(api_url, member),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o600)


def token_config(accounts: list[Account]) -> str:
    """The ``KEEL_AUTH__TOKENS`` value for keel-api: each account's static token."""
    return json.dumps(
        {
            account.token: {
                "user_id": account.user_id,
                "project_id": account.project_id,
                "roles": list(account.roles),
            }
            for account in accounts
        }
    )


# --- the processes -------------------------------------------------------------------


@dataclass
class Cloud:
    """The running processes, started in order and stopped in reverse."""

    group: ProcessGroup
    stop_requested: bool = False

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        if not self.stop_requested:
            say(f"{signal.Signals(signum).name} received: stopping")
        self.stop_requested = True

    def dead(self) -> Process | None:
        return next(iter(self.group.dead()), None)

    def stop_all(self) -> None:
        self.group.stop_all(
            on_kill=lambda p: say(f"{p.name} did not stop within {STOP_TIMEOUT:.0f}s: killed it")
        )


#: The SSH forward port of the first agent's guests (the second's is the next one).
FORWARD_PORT = 2222


def start_all(cloud: Cloud, workdir: Path, env: Mapping[str, str]) -> None:
    """Start the cloud's processes in order: agents need the conductor first."""

    def start(name: str, binary: str, **extra: str) -> None:
        say(f"starting {name} (log: {cloud.group.logs / f'{name}.log'})")
        cloud.group.start(name, [binary], {**env, **extra})

    start("conductor", "keel-conductor")
    start("scheduler", "keel-scheduler")
    for index, host in enumerate(COMPUTE_HOSTS):
        state_dir = workdir / host
        state_dir.mkdir(parents=True, exist_ok=True)
        # Both agents share this machine's libvirtd: each names its hypervisor after its
        # host unless KEEL_COMPUTE__HYPERVISOR_HOSTNAME says otherwise.
        start(
            host,
            "keel-compute",
            KEEL_HOST=host,
            KEEL_STATE_DIR=str(state_dir.resolve()),
            KEEL_COMPUTE__HYPERVISOR_HOSTNAME=env.get("KEEL_COMPUTE__HYPERVISOR_HOSTNAME", host),
            # Guests' SSH forwards: one port per agent (a guest moved between the two may
            # run beside its old copy, with the same address).
            KEEL_LIBVIRT__SSH_FORWARD_PORT=env.get(
                "KEEL_LIBVIRT__SSH_FORWARD_PORT", str(FORWARD_PORT + index)
            ),
        )
    start("api", "keel-api")


async def _computes_up(settings: Settings) -> set[str]:
    async with connect(settings.database_url) as conn:
        up = await up_services(conn, settings.service_down_time)
    return {host for binary, host in up if binary == "keel-compute"}


def wait_until_ready(cloud: Cloud, settings: Settings, api_url: str) -> bool:
    """Poll until the API answers and every agent is up; False if a process died."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not cloud.stop_requested:
        if (died := cloud.dead()) is not None:
            report_death(died, "during start-up")
            return False
        if api_answers(api_url) and set(COMPUTE_HOSTS) <= asyncio.run(_computes_up(settings)):
            return True
        if time.monotonic() > deadline:
            say(f"the cloud was not ready within {READY_TIMEOUT:.0f}s; see the logs")
            for process in cloud.group.processes.values():
                print(f"  {process.name}: {process.log}\n{indented_tail(process)}")
            return False
        time.sleep(0.5)
    return False


def indented_tail(process: Process) -> str:
    return "\n".join("    " + line for line in process.tail(LOG_TAIL_LINES).splitlines())


def report_death(process: Process, when: str) -> None:
    say(
        f"{process.name} exited with code {process.exit_code()} {when}; "
        f"last lines of {process.log}:"
    )
    print(indented_tail(process), flush=True)


def print_banner(api_url: str, clouds: Path) -> None:
    print(
        f"""
keel is running.
  compute API:  {api_url}/v2.1/
  image API:    {api_url}/image/
  clouds.yaml:  {clouds}
                (static tokens: keel = admin, keel-member = member;
                 passwords: keel-password = admin, keel-password-member = member)
  logs:         {clouds.parent / "logs"}/

Try:
  OS_CLIENT_CONFIG_FILE={clouds} openstack --os-cloud keel server create \\
      --flavor m1.tiny --image cirros --wait demo
  OS_CLIENT_CONFIG_FILE={clouds} openstack --os-cloud keel compute service list
  OS_CLIENT_CONFIG_FILE={clouds} openstack --os-cloud keel-password-member quota show

Press Ctrl-C to stop.
""",
        flush=True,
    )


def run(settings: Settings, workdir: Path) -> int:
    api_host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::") else settings.api_host
    api_url = f"http://{api_host}:{settings.api_port}"
    if not check_prerequisites(settings) or not check_port_free(
        settings.api_host, settings.api_port
    ):
        return 1
    if (pid := running_pid(workdir)) is not None:
        say(f"this checkout's local cloud is already running (pid {pid})")
        return 1
    if subprocess.run([str(BIN / "keel-manage"), "db", "sync"], check=False).returncode != 0:
        return 1
    foreign = asyncio.run(foreign_hosts(settings, workdir, COMPUTE_HOSTS))
    if foreign:
        say(explain_foreign(settings, workdir, foreign))
        return 1
    if asyncio.run(seed_image(settings.database_url)):
        say(f"registered image cirros ({CIRROS_ID})")
    workdir.mkdir(parents=True, exist_ok=True)
    if settings.compute.driver == "libvirt" and not prepare_libvirt(settings, workdir):
        return 1
    record_pid(workdir)
    try:
        return _run_cloud(settings, workdir, api_url)
    finally:
        forget_pid(workdir)


def libvirt_env(settings: Settings, workdir: Path) -> dict[str, str]:
    """What the libvirt driver needs that ``make run`` provides unless it is set: an
    image store, a URL secret shared by keel-api and keel-conductor (new every run), the
    metadata service on 127.0.0.1:8775 with a secret shared by keel-api and the agents
    (new every run), and the guests' SSH forwards shown as the network ``forwarded``."""
    metadata = "127.0.0.1:8775"
    env = {
        "KEEL_IMAGES__URL_SECRET": secrets.token_urlsafe(32),
        "KEEL_METADATA__BIND": metadata,
        "KEEL_METADATA__URL": f"http://{metadata}",
        "KEEL_METADATA__SECRET": secrets.token_urlsafe(32),
        "KEEL_NETWORK__FORWARD_NAME": "forwarded",
    }
    if "KEEL_IMAGES__STORE_DIR" not in os.environ:
        env["KEEL_IMAGES__STORE_DIR"] = str((workdir / "image-store").resolve())
    return {key: value for key, value in env.items() if key not in os.environ}


def prepare_libvirt(settings: Settings, workdir: Path) -> bool:
    """Build the test guest if missing and register it with its data (libvirt driver)."""
    if not build_guest(workdir / "images"):
        return False
    store = Path(
        libvirt_env(settings, workdir).get("KEEL_IMAGES__STORE_DIR", str(settings.images.store_dir))
    )
    for name in asyncio.run(register_guest(settings.database_url, store, workdir / "images")):
        say(f"registered image {name}")
    return True


def _run_cloud(settings: Settings, workdir: Path, api_url: str) -> int:
    admin, member = accounts = asyncio.run(ensure_accounts(settings.database_url))
    # The agents' host fences outlive them by design; this cloud stops its own at the end.
    run_id = tag_this_run()
    clouds = workdir / "clouds.yaml"
    write_clouds_yaml(clouds, api_url, admin, member)
    env = {**os.environ, "KEEL_AUTH__TOKENS": token_config(accounts)}
    env.setdefault("KEEL_LOG_FORMAT", "text")
    if settings.compute.driver == "libvirt":
        env.update(libvirt_env(settings, workdir))
    cloud = Cloud(ProcessGroup(workdir / "logs", stop_timeout=STOP_TIMEOUT))
    signal.signal(signal.SIGINT, cloud.request_stop)
    signal.signal(signal.SIGTERM, cloud.request_stop)
    try:
        start_all(cloud, workdir, env)
        if not wait_until_ready(cloud, settings, api_url):
            return 0 if cloud.stop_requested else 1
        print_banner(api_url, clouds)
        while not cloud.stop_requested:
            if (died := cloud.dead()) is not None:
                report_death(died, "unexpectedly")
                return 1
            time.sleep(0.5)
        return 0
    finally:
        cloud.stop_all()
        if fences := stop_fences(run_id):
            say(f"stopped {fences} host fence(s) (keel-fence)")
        say("stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "action",
        nargs="?",
        choices=("run", "clean"),
        default="run",
        help="run the cloud (default), or clean: drop its database and work directory",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(".keel"),
        help="where clouds.yaml, logs and agent state go (default: .keel)",
    )
    args = parser.parse_args(argv)
    try:
        settings = load_settings(None)
        if args.action == "clean":
            clean(settings, args.workdir, say)
            return 0
        return run(settings, args.workdir)
    except ConfigError as exc:
        say(exc.message)
        return 2
    except KeelError as exc:
        say(exc.message)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
