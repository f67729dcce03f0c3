"""``make run``: the local-cloud launcher brings a cloud up, Ctrl-C takes it down, and
``make clean`` lets a fresh clone start over on a database another checkout used."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from devkit import ROOT
from devkit.broker import remove_exchange
from devkit.database import Scratch
from devkit.environment import clean_environ, keel_env, with_devkit
from devkit.processes import BIN
from devkit.readiness import free_port
from devkit.servers import AMQP_URL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

LAUNCHER = ROOT / "deploy" / "localcloud.py"
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 90.0


def launcher_env(database_url: str, exchange: str, port: int) -> dict[str, str]:
    """The launcher's environment: the settings of a test cloud, and devkit importable."""
    return with_devkit(
        keel_env(
            database_url=database_url,
            transport_url=AMQP_URL,
            exchange=exchange,
            api_bind=f"127.0.0.1:{port}",
            vcpus=2,
            memory_mb=4096,
            local_gb=20,
        )
    )


def processes_in(exchange: str) -> list[int]:
    """Pids of live processes whose environment names ``exchange``."""
    needle = f"KEEL_EXCHANGE={exchange}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def read_until_ready(launcher: subprocess.Popen[str]) -> str:
    assert launcher.stdout is not None
    seen = []
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("Press Ctrl-C"):
            return "".join(seen)
    launcher.send_signal(signal.SIGINT)
    rest, _ = launcher.communicate(timeout=STOP_TIMEOUT)
    pytest.fail("launcher never became ready:\n" + "".join(seen) + rest)


def openstack(clouds: Path, cloud: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_environ()
    env["OS_CLIENT_CONFIG_FILE"] = str(clouds)
    return subprocess.run(
        [str(BIN / "openstack"), "--os-cloud", cloud, *args, "-f", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
async def run_exchange() -> AsyncIterator[str]:
    """An exchange for one launcher run, removed from the broker afterwards."""
    name = f"keel-run-{uuid.uuid4().hex[:12]}"
    yield name
    await remove_exchange(name)


@pytest.fixture
async def fresh_database_url(databases: Scratch) -> AsyncIterator[str]:
    """The URL of a database that does not exist yet; dropped afterwards if it was made."""
    url = databases.unborn("run")
    yield url
    await databases.drop(url)


def launch(workdir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(LAUNCHER), "--workdir", str(workdir)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_to_end(workdir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the launcher to its end (``clean``, or a run that is refused)."""
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *args, "--workdir", str(workdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=READY_TIMEOUT,
        check=False,
    )


def a_fresh_clone_recovers(fresh: Path, env: dict[str, str]) -> None:
    """After a cloud ran on the database: a clone is told the way out, and takes it."""
    refused = run_to_end(fresh, env)
    assert refused.returncode == 1, refused.stdout
    assert "already has compute hosts whose node identity files are not in" in refused.stdout
    assert "compute1: node" in refused.stdout
    assert "compute2: node" in refused.stdout
    assert "make clean" in refused.stdout
    cleaned = run_to_end(fresh, env, "clean")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert "removing database" in cleaned.stdout
    assert "dropped database" in cleaned.stdout
    launcher = launch(fresh, env)
    try:
        read_until_ready(launcher)
        server = openstack(
            fresh / "clouds.yaml", "keel", "server", "create", "--flavor", "m1.tiny",
            "--image", "cirros", "--wait", "after-clean",
        )  # fmt: skip
        assert server.returncode == 0, server.stderr
        assert json.loads(server.stdout)["status"] == "ACTIVE"
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=STOP_TIMEOUT)
        assert launcher.returncode == 0, output
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_make_run_starts_a_usable_cloud_stops_on_ctrl_c_and_make_clean_starts_over(
    tmp_path: Path, fresh_database_url: str, run_exchange: str
) -> None:
    database_url = fresh_database_url
    exchange = run_exchange
    workdir = tmp_path / "keel"
    env = launcher_env(database_url, exchange, free_port())
    launcher = launch(workdir, env)
    try:
        banner = read_until_ready(launcher)
        clouds = workdir / "clouds.yaml"
        assert f"OS_CLIENT_CONFIG_FILE={clouds} openstack --os-cloud keel" in banner
        config = yaml.safe_load(clouds.read_text())
        assert set(config["clouds"]) == {
            "keel", "keel-member", "keel-password", "keel-password-member",
        }  # fmt: skip
        assert config["clouds"]["keel"]["auth_type"] == "admin_token"
        password = config["clouds"]["keel-password-member"]
        assert password["auth_type"] == "password"
        assert not any(key.endswith("endpoint_override") for key in password)

        services = openstack(clouds, "keel", "compute", "service", "list")
        assert services.returncode == 0, services.stderr
        assert {"compute1", "compute2"} <= {s["Host"] for s in json.loads(services.stdout)}
        images = openstack(clouds, "keel", "image", "list")
        assert [i["Name"] for i in json.loads(images.stdout)] == ["cirros"]
        as_member = openstack(clouds, "keel-member", "hypervisor", "list")
        assert as_member.returncode != 0
        quota = openstack(clouds, "keel-password-member", "quota", "show")
        assert quota.returncode == 0, quota.stderr
        projects = openstack(clouds, "keel-password", "project", "list")
        assert {p["Name"] for p in json.loads(projects.stdout)} == {"admin", "demo"}
        same_project = openstack(clouds, "keel", "quota", "show", "--compute", "admin")
        assert same_project.returncode == 0, same_project.stderr
        listed = openstack(clouds, "keel", "server", "list", "--all-projects")
        assert listed.returncode == 0, listed.stderr
        while_running = run_to_end(workdir, env, "clean")
        assert while_running.returncode == 1
        assert "this checkout's local cloud is running" in while_running.stdout
        assert clouds.exists()

        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=STOP_TIMEOUT)
        assert launcher.returncode == 0, output
        assert processes_in(exchange) == []
        assert (workdir / "logs" / "api.log").stat().st_size > 0

        a_fresh_clone_recovers(tmp_path / "clone" / ".keel", env)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in processes_in(exchange):
            os.kill(pid, signal.SIGKILL)


def test_make_run_explains_how_to_start_a_missing_database(tmp_path: Path) -> None:
    env = launcher_env("postgresql://postgres@127.0.0.1:1/keel", "keel-unused", free_port())
    result = subprocess.run(
        [sys.executable, str(LAUNCHER), "--workdir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "PostgreSQL is not reachable at 127.0.0.1:1" in result.stdout
    assert "pg_ctlcluster" in result.stdout
    assert "docker compose up -d postgres" in result.stdout
    assert not (tmp_path / "clouds.yaml").exists()


def test_make_run_stops_everything_when_a_process_dies_at_start_up(
    tmp_path: Path, fresh_database_url: str, run_exchange: str
) -> None:
    exchange = run_exchange
    (tmp_path / "compute1").mkdir()
    (tmp_path / "compute1" / "compute_id").write_text("not a uuid\n")
    result = subprocess.run(
        [sys.executable, str(LAUNCHER), "--workdir", str(tmp_path)],
        env=launcher_env(fresh_database_url, exchange, free_port()),
        capture_output=True,
        text=True,
        timeout=READY_TIMEOUT,
        check=False,
    )
    assert result.returncode == 1
    assert "compute1 exited with code 1 during start-up" in result.stdout
    assert "compute_id" in result.stdout.split("during start-up", 1)[1]
    assert "keel is running" not in result.stdout
    assert processes_in(exchange) == []
