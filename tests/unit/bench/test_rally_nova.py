"""What ``bench/rally_nova.py`` stands on: the Networking stub Nova is given, and CPU
time counted per session, children that already exited included."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from benchkit import network_stub
from rally_nova import Snapshot

from devkit.processes import ProcessGroup
from devkit.readiness import free_port


@pytest.fixture
def stub() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, network_stub.__file__, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the stub did not answer"
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def test_the_stub_answers_nova_reads_with_nothing(stub: str) -> None:
    versions = httpx.get(stub).json()["versions"]
    assert versions[0]["id"] == "v2.0"
    assert versions[0]["links"][0]["href"] == f"{stub}/v2.0/"
    ports = httpx.get(f"{stub}/v2.0/ports", params={"device_id": "x"})
    assert ports.status_code == 200
    assert ports.json() == {"ports": []}
    assert httpx.get(f"{stub}/v2.0/security-groups").json() == {"security_groups": []}
    assert httpx.get(f"{stub}/v2.0/quotas/p1").json()["quota"]["port"] == -1


def test_the_stub_refuses_what_it_does_not_serve(stub: str) -> None:
    assert httpx.get(f"{stub}/v2.0/ports/some-port").status_code == 404
    assert httpx.post(f"{stub}/v2.0/ports", json={"port": {}}).status_code == 501


#: Burns about ``seconds`` of CPU in a grandchild that has exited (and was waited for)
#: by the time the child sleeps.
SPENDER = """
import subprocess, sys, time
burn = "import time\\nend = time.process_time() + float(__import__('sys').argv[1])\\n" \\
       "while time.process_time() < end: pass"
subprocess.run([sys.executable, "-c", burn, sys.argv[1]], check=True)
print("spent", flush=True)
time.sleep(60)
"""


def test_a_session_counts_the_cpu_of_children_that_exited(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    process = group.start("spender", [sys.executable, "-c", SPENDER, "0.5"], {})
    try:
        deadline = time.monotonic() + 30
        while "spent" not in process.read_log():
            assert time.monotonic() < deadline, process.tail()
            time.sleep(0.05)
        # Since it started: all of its session's time is its own.
        spent = Snapshot.take(group.processes, "no-such-database").minus(Snapshot())
    finally:
        group.stop_all()
    assert spent.processes["spender"] >= 0.45
    assert spent.database == 0
