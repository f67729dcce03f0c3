"""The least of a Networking API that Nova needs to boot and delete a server with no network.

Nova has no network of its own any more: even a server booted with ``networks: none``
is deleted through Neutron (``GET /v2.0/ports?device_id=...`` to find its ports), and
nova-compute's periodic task refreshes every server's network information from it.
This answers those reads with nothing, as a Neutron with no ports would: ``GET /``
(the version document), ``GET /v2.0/quotas/<project>`` (unlimited: Nova reads the
port quota before a boot) and ``GET /v2.0/<collection>`` with an empty collection.
Anything else is a 404, so a call this does not serve shows up in Nova's log.

Standard library only, one thread per connection::

    python bench/benchkit/network_stub.py PORT
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "":
            base = f"http://{self.headers.get('Host', '127.0.0.1')}"
            version = {"id": "v2.0", "status": "CURRENT",
                       "links": [{"href": f"{base}/v2.0/", "rel": "self"}]}  # fmt: skip
            self.answer(200, {"versions": [version]})
        elif path.startswith("/v2.0/quotas/"):
            # Unlimited: Nova then counts no ports before a boot.
            self.answer(200, {"quota": {"port": -1, "network": -1, "subnet": -1}})
        elif path.startswith("/v2.0/") and path.count("/") == 2:
            collection = path.removeprefix("/v2.0/").removesuffix(".json")
            self.answer(200, {collection.replace("-", "_"): []})
        else:
            self.answer(404, {"NeutronError": {"type": "HTTPNotFound", "message": path}})

    def answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: one line per request would cost more than the answer."""


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
