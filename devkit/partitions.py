"""Hosts with networks of their own, and real partitions between them and the broker.

Each :class:`NetHost` is a network namespace and a UTS namespace (so its kernel host name
is its own: an agent started in it without ``KEEL_HOST`` registers under that name, and
changing it is a real rename), joined to the root namespace by a veth pair that
:class:`Partitions` creates. The only thing a host reaches is a TCP forwarder
(:mod:`devkit.forwarder`) bound to the root side of its veth, which forwards to the
broker (RabbitMQ listens on 127.0.0.1 only); inside, its only route is to that address,
and where ``iptables`` exists its OUTPUT allows that one port and nothing else.

Faults, for one host or a set: :meth:`Partitions.cut` (the root side of the link down:
packets vanish, connections hang, as in a real cut), :meth:`Partitions.cut_forwarder`
(connections closed, new ones refused), :meth:`Partitions.loss` and
:meth:`Partitions.delay` (``tc netem`` on both ends; on kernels without ``sch_netem``
loss is iptables' ``statistic`` match inside the host and delay is held in the
forwarder, said once in the log), and :meth:`Partitions.heal`, which undoes them all.

Everything is named with the prefix ``kp`` and the run's id: namespaces
``kp-<run>-<n>``, root-side veths ``kp<run><n>``, state under
``/run/keel-partitions/<run>/``, addresses in :data:`SUBNET` (one /30 per host). A run
holds an ``flock`` on its directory's lock file while it lives; :meth:`Partitions.open`
removes what runs that hold theirs no more left behind (they crashed or were killed),
and :meth:`Partitions.close` removes its own, also when the harness fails.

It needs root, ``ip`` (iproute2), ``nsenter`` and ``unshare`` (util-linux):
:func:`unsupported` says why a machine cannot run it.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from devkit.forwarder import Forwarder, Listener

LOG = logging.getLogger(__name__)

#: Where runs keep their locks and UTS namespace files.
RUN_ROOT = Path("/run/keel-partitions")
#: Private addresses unlikely to be in use: one /30 per host.
SUBNET = ipaddress.IPv4Network("10.231.0.0/16")
PREFIX = "kp"
_RUN = re.compile(r"^[0-9a-f]{4}$")
#: The interface a host sees.
INSIDE = "eth0"
COMMAND_TIMEOUT = 20.0


class Unsupported(Exception):
    """This machine cannot make namespaces (not root, a tool missing, ...)."""


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if found is None:
        raise Unsupported(f"{name} is not installed")
    return found


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command of the harness; a failure raises with its output."""
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return result


def unsupported() -> str | None:
    """Why namespaces cannot be made here (``None``: they can)."""
    if os.geteuid() != 0:
        return "network and UTS namespaces need root (CI runs as root)"
    try:
        for tool in ("ip", "nsenter", "unshare", "tc"):
            _tool(tool)
    except Unsupported as exc:
        return f"{exc} (apt-get install iproute2 util-linux)"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


def _netem_works(device: str) -> bool:
    added = run("tc", "qdisc", "add", "dev", device, "root", "netem", "delay", "1ms", check=False)
    if added.returncode != 0:
        return False
    run("tc", "qdisc", "del", "dev", device, "root", check=False)
    return True


@dataclass
class NetHost:
    """One host: its namespaces, its link and the forwarder it reaches the broker by."""

    index: int
    netns: str
    uts: Path
    veth: str
    root_ip: str
    ns_ip: str
    listener: Listener
    #: The kernel host name set in its UTS namespace.
    hostname: str
    faults: set[str] = field(default_factory=set)

    @property
    def broker_address(self) -> str:
        """``HOST:PORT`` an agent in this host reaches the broker at."""
        return self.listener.address

    def argv(self, program: str, *args: str) -> list[str]:
        """``program`` run inside this host's namespaces (``nsenter`` execs it)."""
        return [
            _tool("nsenter"),
            f"--net=/run/netns/{self.netns}",
            f"--uts={self.uts}",
            "--",
            program,
            *args,
        ]

    def inside(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command in this host's namespaces."""
        return run(*self.argv(*argv), check=check)


class Partitions:
    """The hosts of one run and their faults; see the module's text."""

    def __init__(self, run_id: str, directory: Path, lock: int, broker: tuple[str, int]) -> None:
        self.run_id = run_id
        self.directory = directory
        self._lock = lock
        self.broker = broker
        self.forwarder = Forwarder()
        self.hosts: dict[str, NetHost] = {}
        self._netem: bool | None = None
        self._iptables = shutil.which("iptables") is not None
        self._told: set[str] = set()

    # --- life --------------------------------------------------------------------------

    @classmethod
    def open(cls, broker: tuple[str, int]) -> Partitions:
        """A new run forwarding to ``broker``; what crashed runs left is removed first."""
        reason = unsupported()
        if reason is not None:
            raise Unsupported(reason)
        RUN_ROOT.mkdir(parents=True, exist_ok=True)
        remove_leftovers()
        while True:
            run_id = secrets.token_hex(2)
            directory = RUN_ROOT / run_id
            try:
                directory.mkdir()
            except FileExistsError:
                continue
            break
        lock = os.open(directory / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        LOG.info("partition run %s under %s", run_id, directory)
        return cls(run_id, directory, lock, broker)

    def close(self) -> None:
        """Remove every namespace, link and forwarder of this run."""
        try:
            self.forwarder.close()
        finally:
            _remove_run(self.run_id, self.directory)
            os.close(self._lock)

    def __enter__(self) -> Partitions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- hosts -------------------------------------------------------------------------

    def add_host(self, hostname: str) -> NetHost:
        """A new host whose kernel host name is ``hostname``, linked to the broker."""
        index = len(self.hosts)
        netns = f"{PREFIX}-{self.run_id}-{index}"
        veth = f"{PREFIX}{self.run_id}{index:02d}"
        peer = f"{veth}n"
        uts = self.directory / f"uts-{index}"
        uts.touch()
        run("ip", "netns", "add", netns)
        run(_tool("unshare"), f"--uts={uts}", "hostname", hostname)
        with _address_lock():
            root_ip, ns_ip = _free_block()
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            run("ip", "addr", "add", f"{root_ip}/30", "dev", veth)
        run("ip", "link", "set", peer, "netns", netns)
        inside = ("ip", "netns", "exec", netns)
        run(*inside, "ip", "link", "set", peer, "name", INSIDE)
        run(*inside, "ip", "addr", "add", f"{ns_ip}/30", "dev", INSIDE)
        run(*inside, "ip", "link", "set", INSIDE, "up")
        run(*inside, "ip", "link", "set", "lo", "up")
        run("ip", "link", "set", veth, "up")
        listener = self.forwarder.listen(root_ip, self.broker)
        host = NetHost(index, netns, uts, veth, root_ip, ns_ip, listener, hostname)
        if self._iptables:
            self._only_the_broker(host)
        self.hosts[hostname] = host
        return host

    def _only_the_broker(self, host: NetHost) -> None:
        inside = ("ip", "netns", "exec", host.netns, "iptables")
        run(*inside, "-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT")
        run(*inside, "-A", "OUTPUT", "-o", INSIDE, "-p", "tcp", "-d", host.root_ip,
            "--dport", str(host.listener.port), "-j", "ACCEPT")  # fmt: skip
        run(*inside, "-A", "OUTPUT", "-o", INSIDE, "-p", "tcp", "-j", "REJECT",
            "--reject-with", "tcp-reset")  # fmt: skip
        run(*inside, "-A", "OUTPUT", "-o", INSIDE, "-j", "DROP")

    def rename(self, host: NetHost, hostname: str) -> None:
        """Change the host's kernel host name (as ``hostname NEW`` on that machine)."""
        host.inside("hostname", hostname)
        host.hostname = hostname

    def kernel_hostname(self, host: NetHost) -> str:
        return host.inside("hostname").stdout.strip()

    # --- faults ------------------------------------------------------------------------

    def _each(self, hosts: NetHost | Iterable[NetHost]) -> list[NetHost]:
        return [hosts] if isinstance(hosts, NetHost) else list(hosts)

    def cut(self, hosts: NetHost | Iterable[NetHost]) -> None:
        """Take the link down: nothing passes, connections hang as in a real cut."""
        for host in self._each(hosts):
            run("ip", "link", "set", host.veth, "down")
            host.faults.add("cut")

    def cut_forwarder(self, hosts: NetHost | Iterable[NetHost]) -> None:
        """Close the host's broker connections and refuse new ones."""
        for host in self._each(hosts):
            host.listener.cut()
            host.faults.add("refused")

    def netem(self) -> bool:
        """Whether ``tc netem`` works on this kernel (found out once, and said if not)."""
        if self._netem is None:
            first = next(iter(self.hosts.values()), None)
            self._netem = first is not None and _netem_works(first.veth)
            if not self._netem:
                LOG.warning(
                    "tc netem is not available on this kernel (sch_netem is missing): "
                    "delay is held in the forwarder, and loss %s",
                    "is iptables' statistic match"
                    if self._iptables
                    else "cannot be made (no iptables)",
                )
        return self._netem

    def loss(self, hosts: NetHost | Iterable[NetHost], percent: float) -> bool:
        """Drop ``percent`` % of the packets each way; False if this machine cannot."""
        for host in self._each(hosts):
            if self.netem():
                for argv in self._both_ends(host):
                    run(*argv, "root", "netem", "loss", f"{percent:g}%")
            elif self._iptables:
                probability = f"{percent / 100:.4f}"
                inside = ("ip", "netns", "exec", host.netns, "iptables")
                for chain, way in (("INPUT", "-i"), ("OUTPUT", "-o")):
                    run(*inside, "-I", chain, "1", way, INSIDE, "-m", "statistic", "--mode",
                        "random", "--probability", probability, "-j", "DROP")  # fmt: skip
            else:
                return False
            host.faults.add("loss")
        return True

    def delay(self, hosts: NetHost | Iterable[NetHost], seconds: float) -> None:
        """Hold every packet (or chunk) ``seconds`` longer each way."""
        for host in self._each(hosts):
            if self.netem():
                for argv in self._both_ends(host):
                    run(*argv, "root", "netem", "delay", f"{seconds * 1000:.0f}ms")
            else:
                host.listener.set_delay(seconds)
            host.faults.add("delay")

    def _both_ends(self, host: NetHost) -> Iterator[tuple[str, ...]]:
        yield ("tc", "qdisc", "replace", "dev", host.veth)
        yield ("ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", INSIDE)

    def heal(self, hosts: NetHost | Iterable[NetHost]) -> None:
        """Undo every fault of the hosts: link up, forwarder open, no loss, no delay."""
        for host in self._each(hosts):
            run("ip", "link", "set", host.veth, "up")
            host.listener.heal()
            if "loss" in host.faults or "delay" in host.faults:
                if self._netem:
                    run("tc", "qdisc", "del", "dev", host.veth, "root", check=False)
                    run("ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", INSIDE,
                        "root", check=False)  # fmt: skip
                elif "loss" in host.faults:
                    self._drop_loss_rules(host)
            host.faults.clear()

    def _drop_loss_rules(self, host: NetHost) -> None:
        inside = ("ip", "netns", "exec", host.netns, "iptables")
        for chain in ("INPUT", "OUTPUT"):
            while True:
                listed = run(*inside, "-S", chain).stdout
                rule = next((line for line in listed.splitlines() if "statistic" in line), None)
                if rule is None:
                    break
                run(*inside, *rule.replace("-A", "-D", 1).split())


@contextlib.contextmanager
def _address_lock() -> Iterator[None]:
    """Held while a run picks and assigns an address block (runs may be concurrent)."""
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    fd = os.open(RUN_ROOT / "addresses.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _free_block() -> tuple[str, str]:
    """The root-side and host-side addresses of a /30 of :data:`SUBNET` no one uses."""
    used = set(re.findall(r"inet (\d+\.\d+\.\d+\.\d+)", run("ip", "-4", "-o", "addr").stdout))
    for block in SUBNET.subnets(new_prefix=30):
        root_ip, ns_ip = (str(a) for a in list(block.hosts())[:2])
        if root_ip not in used:
            return root_ip, ns_ip
    raise RuntimeError(f"no free /30 left in {SUBNET}")


def _remove_run(run_id: str, directory: Path) -> None:
    """Remove a run's namespaces, veths and UTS files (whatever of them exists)."""
    for netns in run("ip", "netns", "list", check=False).stdout.split("\n"):
        name = netns.split(" ")[0]
        if name.startswith(f"{PREFIX}-{run_id}-"):
            run("ip", "netns", "del", name, check=False)
    links = run("ip", "-o", "link", "show", check=False).stdout
    for name in re.findall(rf"^\d+: ({PREFIX}{run_id}\d+n?)[@:]", links, flags=re.M):
        run("ip", "link", "del", name, check=False)
    if directory.is_dir():
        for entry in directory.glob("uts-*"):
            run("umount", str(entry), check=False)
            entry.unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)


def remove_leftovers() -> list[str]:
    """Remove what runs whose lock nobody holds any more left behind; their ids."""
    removed: list[str] = []
    if not RUN_ROOT.is_dir():
        return removed
    for directory in RUN_ROOT.iterdir():
        if not directory.is_dir() or not _RUN.match(directory.name):
            continue
        lock = directory / "lock"
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # a live run
            os.close(fd)
        _remove_run(directory.name, directory)
        removed.append(directory.name)
    live = {d.name for d in RUN_ROOT.iterdir() if d.is_dir()}
    listed = run("ip", "netns", "list", check=False).stdout
    orphans = set(re.findall(rf"^{PREFIX}-([0-9a-f]{{4}})-\d+", listed, flags=re.M)) - live
    for run_id in sorted(orphans):
        _remove_run(run_id, RUN_ROOT / run_id)
        removed.append(run_id)
    if removed:
        LOG.info("removed the namespaces of partition runs that ended without them: %s", removed)
    return removed
