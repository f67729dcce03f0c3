"""What the network tests give guests and read back from them."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import subprocess
import time
import uuid
from pathlib import Path

from shared.objects.network import FixedIp, mac_address

#: Seconds a guest may take to print a line after it started (software emulation).
LINE_TIMEOUT = 90.0
NETWORK_ID = uuid.UUID("5d0c1a44-2f0e-4f6b-9a51-6b65656c0099")


def random_network() -> ipaddress.IPv4Network:
    """A /24 unlikely to be another test run's on this machine: forwards are per address."""
    return ipaddress.IPv4Network(f"10.{random.randint(1, 254)}.{random.randint(0, 255)}.0/24")


def fixed_ip(network: ipaddress.IPv4Network, host: int) -> FixedIp:
    address = str(network.network_address + host)
    return FixedIp(
        network_id=NETWORK_ID,
        network_name="private",
        address=address,
        mac=mac_address(NETWORK_ID, address),
        cidr=str(network),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def ssh_banner(host: str, port: int, timeout: float = LINE_TIMEOUT) -> bytes:
    """The first line an SSH server sends on ``host:port`` (retried until it answers)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            try:
                line = await asyncio.wait_for(reader.readline(), 10)
            finally:
                writer.close()
            if line:
                return line
        except (OSError, TimeoutError):
            pass
        assert time.monotonic() < deadline, f"no SSH server answered on {host}:{port}"
        await asyncio.sleep(1)


def make_key(directory: Path, comment: str) -> tuple[Path, str]:
    """A new ed25519 key pair: the private key's file and the public key's line."""
    private = directory / f"{comment}.pem"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(private)],
        check=True,
        capture_output=True,
    )
    return private, private.with_suffix(".pem.pub").read_text().strip()


async def ssh_run(host: str, port: int, key: Path, command: str) -> str:
    """``command``'s output, run as root over SSH with ``key`` (retried while the guest's
    SSH server comes up or its key is not installed yet)."""
    argv = ["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", f"root@{host}", command]  # fmt: skip
    deadline = time.monotonic() + LINE_TIMEOUT
    while True:
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode == 0:
            return done.stdout
        assert time.monotonic() < deadline, f"ssh {host}:{port} failed: {done.stderr}"
        await asyncio.sleep(2)
