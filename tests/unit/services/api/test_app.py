"""The application around the routes: discovery, auth, microversions, faults, request ids.

No database here: every request below is answered before a route would query one.
(An unknown token is looked up among issued tokens, in the database: see the
functional tests.)
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, cast

import asyncpg
import httpx
import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from services.api.app import create_app
from services.api.http.microversion import MAX_VERSION
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import AuthSettings, Settings, TokenInfo
from shared.rpc.fake import FakeTransport

ADMIN = {"X-Auth-Token": "admin-secret"}
MEMBER = {"X-Auth-Token": "member-secret"}


class _NoDatabase:
    def acquire(self) -> Any:
        raise AssertionError("this request should not reach the database")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        auth=AuthSettings(
            tokens={
                "admin-secret": TokenInfo(user_id="root", project_id="ops", roles=["admin"]),
                "member-secret": TokenInfo(user_id="alice", project_id="team"),
            }
        )
    )
    transport = FakeTransport()
    app = create_app(
        settings,
        cast(asyncpg.Pool, _NoDatabase()),
        ConductorAPI(transport),
        ComputeAPI(transport),
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http


async def test_root_lists_the_compute_versions(client: httpx.AsyncClient) -> None:
    response = await client.get("/")
    assert response.status_code == 200
    [legacy, version] = response.json()["versions"]
    assert (legacy["id"], legacy["status"]) == ("v2.0", "DEPRECATED")
    assert legacy["links"][0] == {"rel": "self", "href": "http://keel.test/v2/"}
    assert version["id"] == "v2.1"
    assert version["status"] == "CURRENT"
    assert version["version"] == str(MAX_VERSION)
    assert version["min_version"] == "2.1"
    assert version["links"][0] == {"rel": "self", "href": "http://keel.test/v2.1/"}


@pytest.mark.parametrize("path", ["/v2.1", "/v2.1/"])
async def test_compute_version_document(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(path, headers={"Accept": "text/html"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    version = response.json()["version"]
    assert (version["id"], version["version"], version["min_version"]) == (
        "v2.1",
        str(MAX_VERSION),
        "2.1",
    )
    assert response.headers["OpenStack-API-Version"] == "compute 2.1"


async def test_image_discovery_document(client: httpx.AsyncClient) -> None:
    response = await client.get("/image/")
    assert response.status_code == 200
    current = response.json()["versions"][0]
    assert current["status"] == "CURRENT"
    assert current["links"][0]["href"] == "http://keel.test/image/v2/"


async def test_no_token_is_401(client: httpx.AsyncClient) -> None:
    response = await client.get("/v2.1/servers")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2.1/os-services"),
        ("GET", "/v2.1/os-hypervisors/detail"),
        ("DELETE", "/v2.1/flavors/1"),
        ("PUT", "/v2.1/os-quota-class-sets/default"),
        ("GET", "/v2.1/os-instance_usage_audit_log"),
    ],
)
async def test_members_get_403_on_admin_routes(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, path, headers=MEMBER, json={"name": "x"})
    assert response.status_code == 403
    assert response.json()["forbidden"]["code"] == 403


async def test_unsupported_microversion_is_406(client: httpx.AsyncClient) -> None:
    headers = {**ADMIN, "OpenStack-API-Version": f"compute 2.{MAX_VERSION.minor + 1}"}
    response = await client.get("/v2.1/servers", headers=headers)
    assert response.status_code == 406
    assert f"maximum is {MAX_VERSION}" in response.json()["notAcceptable"]["message"]


async def test_malformed_microversion_is_400(client: httpx.AsyncClient) -> None:
    headers = {**ADMIN, "X-OpenStack-Nova-API-Version": "two"}
    response = await client.get("/v2.1/servers", headers=headers)
    assert response.status_code == 400
    assert "invalid format" in response.json()["badRequest"]["message"]


async def test_responses_name_the_microversion(client: httpx.AsyncClient) -> None:
    response = await client.get("/v2.1/", headers={"OpenStack-API-Version": "compute latest"})
    assert response.headers["OpenStack-API-Version"] == f"compute {MAX_VERSION}"
    assert response.headers["X-OpenStack-Nova-API-Version"] == str(MAX_VERSION)
    assert "OpenStack-API-Version" in response.headers["Vary"]


async def test_request_id_is_echoed_when_valid(client: httpx.AsyncClient) -> None:
    given = "req-3fa85f64-5717-4562-b3fc-2c963f66afa6"
    response = await client.get("/", headers={"X-OpenStack-Request-ID": given})
    assert response.headers["x-openstack-request-id"] == given
    assert response.headers["x-compute-request-id"] == given


async def test_invalid_request_id_is_replaced(client: httpx.AsyncClient) -> None:
    response = await client.get("/", headers={"X-OpenStack-Request-ID": "mine"})
    assert response.headers["x-openstack-request-id"].startswith("req-")
    assert response.headers["x-openstack-request-id"] != "mine"


async def test_errors_carry_the_request_id_too(client: httpx.AsyncClient) -> None:
    response = await client.get("/v2.1/servers")
    assert response.headers["x-openstack-request-id"].startswith("req-")


async def test_unknown_route_is_item_not_found(client: httpx.AsyncClient) -> None:
    response = await client.get("/v2.1/os-nothing", headers=ADMIN)
    assert response.status_code == 404
    assert "itemNotFound" in response.json()


async def test_wrong_method_is_405_fault(client: httpx.AsyncClient) -> None:
    response = await client.patch("/v2.1/servers", headers=ADMIN)
    assert response.status_code == 405
    assert "badMethod" in response.json()


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v2.1/servers",
        headers={**ADMIN, "Content-Type": "application/json"},
        content=b'{"server": ',
    )
    assert response.status_code == 400
    assert response.json()["badRequest"]["message"].startswith("Malformed request body")


@pytest.mark.parametrize(
    "body",
    [
        {"server": {"name": 1, "imageRef": "x", "flavorRef": "1"}},
        {"server": {"imageRef": "x", "flavorRef": "1"}},
        {"server": "web"},
        {"server": {"name": "web", "imageRef": "x", "flavorRef": "1", "max_count": "many"}},
        [],
    ],
)
async def test_wrong_types_are_400(client: httpx.AsyncClient, body: Any) -> None:
    response = await client.post("/v2.1/servers", headers=ADMIN, json=body)
    assert response.status_code == 400
    assert response.json()["badRequest"]["message"]


async def test_flavor_create_validation_is_400(client: httpx.AsyncClient) -> None:
    body = {"flavor": {"name": "x", "ram": -1, "vcpus": 1, "disk": 1}}
    response = await client.post("/v2.1/flavors", headers=ADMIN, json=body)
    assert response.status_code == 400
    assert "flavor.ram" in response.json()["badRequest"]["message"]


class _FailingDatabase:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def acquire(self, **_: Any) -> Any:
        raise self.error


def _client_with_pool(pool: object) -> httpx.AsyncClient:
    transport = FakeTransport()
    settings = Settings(auth=AuthSettings(tokens={"t": TokenInfo(user_id="u", project_id="p")}))
    app = create_app(
        settings, cast(asyncpg.Pool, pool), ConductorAPI(transport), ComputeAPI(transport)
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://keel.test")


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        asyncpg.CannotConnectNowError("the database system is shutting down"),
        asyncpg.SerializationError("could not serialize access"),
    ],
)
async def test_an_unavailable_database_is_503_with_retry_after(error: BaseException) -> None:
    async with _client_with_pool(_FailingDatabase(error)) as client:
        response = await client.get("/v2.1/flavors", headers={"X-Auth-Token": "t"})
    assert response.status_code == 503
    assert response.json()["serviceUnavailable"]["code"] == 503
    assert int(response.headers["Retry-After"]) > 0
    assert response.headers["x-openstack-request-id"].startswith("req-")


async def test_an_unexpected_error_is_a_500_fault_naming_the_request_id() -> None:
    async with _client_with_pool(_FailingDatabase(RuntimeError("bug"))) as client:
        response = await client.get("/v2.1/flavors", headers={"X-Auth-Token": "t"})
    assert response.status_code == 500
    message = response.json()["computeFault"]["message"]
    assert response.headers["x-openstack-request-id"] in message


def _routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        router = getattr(route, "original_router", None)  # an included router
        yield from _routes(getattr(router, "routes", ()))


def _calls(dependant: Dependant) -> Iterator[tuple[str, Callable[..., Any]]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield getattr(sub.call, "__qualname__", repr(sub.call)), sub.call
        yield from _calls(sub)


def test_every_route_and_dependency_runs_on_the_event_loop() -> None:
    """FastAPI runs a plain ``def`` endpoint or dependency in a worker thread: a thread
    hand-off per call, on every request. keel's are all ``async def`` (none blocks)."""
    transport = FakeTransport()
    app = create_app(
        Settings(),
        cast(asyncpg.Pool, _NoDatabase()),
        ConductorAPI(transport),
        ComputeAPI(transport),
    )
    routes = list(_routes(app.routes))
    assert len(routes) > 100
    threaded = sorted(
        f"{route.path}: {name}"
        for route in routes
        for name, call in [(route.name, route.endpoint), *_calls(route.dependant)]
        if not inspect.iscoroutinefunction(call)
    )
    assert threaded == []
