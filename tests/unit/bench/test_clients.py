"""The benchmarks' clients: a create whose answer was lost is looked up by name."""

from __future__ import annotations

import json
import uuid

import httpx
from benchkit.clients import ADOPTED, ApiClient, create


class DyingApi:
    """A keel-api that records each create, then (when ``dies``) drops the connection
    before answering; its server list filters on the name regex clients send."""

    def __init__(self, *, records: bool) -> None:
        self.records = records
        self.servers: dict[str, str] = {}
        self.lookups = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            name = json.loads(request.content)["server"]["name"]
            if self.records:
                self.servers[name] = str(uuid.uuid4())
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        self.lookups += 1
        wanted = request.url.params["name"].removeprefix("^").removesuffix("$")
        found = [{"id": sid, "name": n} for n, sid in self.servers.items() if n == wanted]
        return httpx.Response(200, json={"servers": found})


def client_of(api: DyingApi) -> ApiClient:
    client = ApiClient(["http://127.0.0.1:1"], "token", lambda: 0.0)
    client._http = [
        httpx.AsyncClient(base_url="http://127.0.0.1:1/v2.1/", transport=httpx.MockTransport(api))
    ]
    return client


async def test_a_create_recorded_before_its_answer_was_lost_is_found_and_kept() -> None:
    api = DyingApi(records=True)
    client = client_of(api)
    answer, server = await create(client, "bd-7")
    await client.close()
    assert answer == ADOPTED
    assert str(server) == api.servers["bd-7"]


async def test_a_create_never_recorded_is_reported_as_the_error_it_met() -> None:
    api = DyingApi(records=False)
    client = client_of(api)
    answer, server = await create(client, "bd-8")
    await client.close()
    assert (answer, server) == ("RemoteProtocolError", None)
    assert api.lookups == 1
