"""The test guest's files served over HTTP, as keel-api serves image data to agents."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from services.compute.rpcapi import BootSource, ImageFile

REPO = Path(__file__).resolve().parents[2]
#: Where ``make image`` leaves the test guest.
BUILT = REPO / ".keel" / "images"


@dataclass
class Served:
    base_url: str
    root: Path
    requests: list[str]

    def image_file(self, name: str, disk_format: str | None = None) -> ImageFile:
        data = (self.root / name).read_bytes()
        return ImageFile(
            id=uuid.uuid5(uuid.NAMESPACE_URL, name),
            name=name,
            url=f"{self.base_url}/{name}",
            size=len(data),
            disk_format=disk_format,
            checksum=hashlib.md5(data, usedforsecurity=False).hexdigest(),
            os_hash_algo="sha512",
            os_hash_value=hashlib.sha512(data).hexdigest(),
        )

    def boot(self) -> BootSource:
        return BootSource(
            image=self.image_file("keel-test.qcow2", "qcow2"),
            kernel=self.image_file("keel-test-kernel"),
            ramdisk=self.image_file("keel-test-ramdisk"),
        )


@contextmanager
def serve(root: Path) -> Iterator[Served]:
    """Serve the files of ``root`` on a free local port; 403 for unknown names."""
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            path = root / self.path.lstrip("/")
            if not path.is_file():
                self.send_error(403)
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Served(f"http://127.0.0.1:{server.server_address[1]}", root, requests)
    finally:
        server.shutdown()
        server.server_close()
