"""``KEEL_COMPUTE__DRIVER=libvirt make run``: keel-test registered, a server boots it,
its console shows its uuid; the guest outlives the cloud, and ``make clean`` removes it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from deploy import guestimage
from devkit.environment import clean_environ
from devkit.processes import BIN
from tests.e2e.test_localcloud import (
    STOP_TIMEOUT,
    fresh_database_url,
    launch,
    launcher_env,
    openstack,
    read_until_ready,
    run_exchange,
    run_to_end,
)
from tests.libvirt.guests import random_network
from tests.libvirt.test_cloud import domain_state
from tests.libvirt.test_tempest_ssh import keel_log_excerpt

__all__ = ["fresh_database_url", "run_exchange"]

pytestmark = pytest.mark.timeout(300)

CONSOLE_TIMEOUT = 60.0


def console_log(clouds: Path, server: str) -> str:
    """``openstack console log show`` (plain text: it has no JSON form)."""
    env = clean_environ()
    env["OS_CLIENT_CONFIG_FILE"] = str(clouds)
    done = subprocess.run(
        [str(BIN / "openstack"), "--os-cloud", "keel", "console", "log", "show", server],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout


def test_make_run_boots_keel_test_and_make_clean_removes_its_guest(
    guest_images: Path,
    libvirt_uri: str,
    tmp_path: Path,
    fresh_database_url: str,
    run_exchange: str,
) -> None:
    workdir = tmp_path / "keel"
    (workdir / "images").mkdir(parents=True)
    for name in (*guestimage.OUTPUTS, guestimage.STAMP):  # built once for the tier
        shutil.copyfile(guest_images / name, workdir / "images" / name)
    from devkit.readiness import free_port  # noqa: PLC0415

    metadata_port = free_port()
    env = {
        **launcher_env(fresh_database_url, run_exchange, free_port()),
        "KEEL_COMPUTE__DRIVER": "libvirt",
        "KEEL_LIBVIRT__SHUTDOWN_TIMEOUT": "10",
        # Another run on this machine has other guest addresses, forwards and metadata port.
        "KEEL_NETWORK__CIDR": str(random_network()),
        "KEEL_METADATA__BIND": f"127.0.0.1:{metadata_port}",
        "KEEL_METADATA__URL": f"http://127.0.0.1:{metadata_port}",
        "KEEL_METADATA__SECRET": "make-run-test-metadata-secret",
    }
    env.pop("KEEL_COMPUTE__MEMORY_MB", None)
    launcher = launch(workdir, env)
    clouds = workdir / "clouds.yaml"
    try:
        banner = read_until_ready(launcher)
        images = json.loads(openstack(clouds, "keel", "image", "list").stdout)
        server = openstack(
            clouds, "keel", "server", "create", "--flavor", "m1.tiny", "--image", "keel-test",
            "--wait", "vm1",
        )  # fmt: skip
        assert server.returncode == 0, server.stderr + keel_log_excerpt(workdir / "logs")
        shown = json.loads(server.stdout)
        sid, host = shown["id"], shown["OS-EXT-SRV-ATTR:host"]
        deadline, console = time.monotonic() + CONSOLE_TIMEOUT, ""
        while f"keel-guest-up {sid}" not in console and time.monotonic() < deadline:
            time.sleep(1)
            console = console_log(clouds, "vm1")
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=STOP_TIMEOUT)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()

    class _Cloud:
        def state_dir(self, name: str) -> Path:
            return workdir / name

    after_stop = domain_state(_Cloud(), host, sid, libvirt_uri)  # type: ignore[arg-type]
    cleaned = run_to_end(workdir, env, "clean")

    assert "registered image keel-test" in banner
    assert {"keel-test", "keel-test-kernel", "keel-test-ramdisk"} <= {i["Name"] for i in images}
    assert shown["status"] == "ACTIVE"
    assert f"keel-guest-up {sid}" in console
    assert launcher.returncode == 0, output
    assert after_stop == "running"
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert "destroyed libvirt domain" in cleaned.stdout
    assert not workdir.exists()
