"""The partition harness itself: hosts that reach the broker and nothing else, faults that
take effect, and what a crashed run leaves removed by the next."""

from __future__ import annotations

import socket
import time

import pytest

from devkit.partitions import (
    PREFIX,
    RUN_ROOT,
    NetHost,
    Partitions,
    remove_leftovers,
    run,
)

pytestmark = [pytest.mark.partitions, pytest.mark.timeout(120)]

#: Connects to HOST:PORT and prints the first bytes the broker answers an AMQP header.
PROBE = """
import socket, sys, time
began = time.monotonic()
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3]))
    s.sendall(b"AMQP\\x00\\x00\\x09\\x01")
    s.settimeout(float(sys.argv[3]))
    print("answered", s.recv(8)[:1] == b"\\x01", round(time.monotonic() - began, 3))
except OSError as exc:
    print("failed", type(exc).__name__)
"""


def probe(host: NetHost, address: str, port: int, timeout: float = 3.0) -> str:
    done = host.inside("python3", "-c", PROBE, address, str(port), str(timeout), check=False)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def net(partitions: Partitions) -> NetHost:
    return partitions.add_host("kp-harness")


def test_a_host_has_its_own_kernel_host_name_and_reaches_only_the_broker(
    partitions: Partitions, net: NetHost
) -> None:
    assert partitions.kernel_hostname(net) == "kp-harness"
    assert socket.gethostname() != "kp-harness", "the machine keeps its own name"
    assert probe(net, net.root_ip, net.listener.port).startswith("answered True")
    assert probe(net, "127.0.0.1", 5432).startswith("failed"), "PostgreSQL must be out of reach"
    assert probe(net, net.root_ip, 5432, timeout=1).startswith("failed")
    routes = net.inside("ip", "-4", "route").stdout
    assert "default" not in routes


def test_a_cut_makes_the_broker_unreachable_until_healed(
    partitions: Partitions, net: NetHost
) -> None:
    partitions.cut(net)
    try:
        assert probe(net, net.root_ip, net.listener.port, timeout=1).startswith("failed")
    finally:
        partitions.heal(net)
    assert probe(net, net.root_ip, net.listener.port).startswith("answered True")

    partitions.cut_forwarder(net)
    try:
        assert probe(net, net.root_ip, net.listener.port, timeout=1).startswith("failed")
    finally:
        partitions.heal(net)
    assert probe(net, net.root_ip, net.listener.port).startswith("answered True")


def test_delay_holds_the_answer_and_heal_lifts_it(partitions: Partitions, net: NetHost) -> None:
    partitions.delay(net, 0.4)
    try:
        slow = probe(net, net.root_ip, net.listener.port)
    finally:
        partitions.heal(net)
    fast = probe(net, net.root_ip, net.listener.port)
    assert slow.startswith("answered True")
    assert float(slow.split()[-1]) >= 0.7, slow  # at least there and back
    assert float(fast.split()[-1]) < float(slow.split()[-1])


def test_what_a_crashed_run_left_is_removed_by_the_next(partitions: Partitions) -> None:
    """A run killed before it could clean up: its namespace, link and directory go."""
    dead = "0dea"
    directory = RUN_ROOT / dead
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "lock").touch()  # nobody holds it any more
    run("ip", "netns", "add", f"{PREFIX}-{dead}-0")
    run("ip", "link", "add", f"{PREFIX}{dead}00", "type", "veth", "peer", "name",
        f"{PREFIX}{dead}00n")  # fmt: skip
    began = time.monotonic()

    removed = remove_leftovers()

    assert dead in removed
    assert partitions.run_id not in removed, "a live run is left alone"
    assert f"{PREFIX}-{dead}-0" not in run("ip", "netns", "list").stdout
    assert f"{PREFIX}{dead}00" not in run("ip", "-o", "link").stdout
    assert not directory.exists()
    assert time.monotonic() - began < 30
