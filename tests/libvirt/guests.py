"""What the network tests give guests and read back from them."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from shared.guest_metadata import GuestInfo, openstack_files, signature
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


async def ssh_run(
    host: str, port: int, key: Path, command: str, *, user: str = "root", timeout: float = 0
) -> str:
    """``command``'s output, run as ``user`` over SSH with ``key`` (retried while the
    guest's SSH server comes up or its key is not installed yet, for ``timeout`` seconds
    or :data:`LINE_TIMEOUT`)."""
    argv = ["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
            f"{user}@{host}", command]  # fmt: skip
    deadline = time.monotonic() + (timeout or LINE_TIMEOUT)
    while True:
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode == 0:
            return done.stdout
        assert time.monotonic() < deadline, f"ssh {host}:{port} failed: {done.stderr}"
        await asyncio.sleep(2)


class StandInMetadata:
    """A metadata service on 127.0.0.1 that answers signed requests from ``guests`` (by
    id) with what keel-api would answer, and counts the requests it refused."""

    def __init__(self, secret: str, guests: dict[str, GuestInfo]) -> None:
        self.secret = secret
        self.guests = guests
        self.refused = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                instance_id = self.headers.get("X-Instance-ID", "")
                signed = self.headers.get("X-Instance-ID-Signature", "")
                guest = service.guests.get(instance_id)
                if guest is None or signed != signature(service.secret, instance_id):
                    service.refused += 1
                    self.send_error(403)
                    return
                parts = [part for part in self.path.split("/") if part]
                files = openstack_files(guest, "latest")
                if parts[:2] != ["openstack", "latest"] or len(parts) != 3 or parts[2] not in files:
                    self.send_error(404)
                    return
                data = files[parts[2]]
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def __enter__(self) -> StandInMetadata:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
