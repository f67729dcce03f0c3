"""What every request meets first: discovery, tokens, roles, microversions."""

from __future__ import annotations

import httpx
import pytest

from services.api.http.microversion import MAX_VERSION
from tests.functional.services.api.conftest import ADMIN, MEMBER, at

pytestmark = pytest.mark.functional


async def test_discovery_needs_no_token(client: httpx.AsyncClient) -> None:
    root = await client.get("/")
    assert root.status_code == 200
    assert [v["id"] for v in root.json()["versions"]] == ["v2.0", "v2.1"]
    legacy = root.json()["versions"][0]
    assert (legacy["status"], legacy["version"], legacy["min_version"]) == ("DEPRECATED", "", "")
    for version in root.json()["versions"]:
        [self_link] = [link for link in version["links"] if link["rel"] == "self"]
        followed = (await client.get(self_link["href"].removeprefix("http://keel.test"))).json()
        assert followed["version"]["links"][0] == self_link
    for path in ("/v2.1", "/v2.1/"):
        version = (await client.get(path)).json()["version"]
        assert version["status"] == "CURRENT"
        assert (version["version"], version["min_version"]) == (str(MAX_VERSION), "2.1")
        assert version["links"][0] == {"rel": "self", "href": "http://keel.test/v2.1/"}
    image = await client.get("/image/")
    assert image.json()["versions"][0]["links"][0]["href"] == "http://keel.test/image/v2/"


async def test_resources_need_a_known_token(client: httpx.AsyncClient) -> None:
    for path in ("/v2.1/servers", "/v2.1/flavors", "/v2.1/images", "/image/v2/images"):
        missing = await client.get(path)
        assert missing.status_code == 401, path
        assert missing.json()["error"]["code"] == 401
        unknown = await client.get(path, headers={"X-Auth-Token": "forged"})
        assert unknown.status_code == 401, path


async def test_members_are_refused_admin_routes(client: httpx.AsyncClient) -> None:
    for path in ("/v2.1/os-services", "/v2.1/os-hypervisors", "/v2.1/os-hypervisors/detail"):
        response = await client.get(path, headers=MEMBER)
        assert response.status_code == 403, path
        assert response.json()["forbidden"]["code"] == 403


async def test_microversion_negotiation(client: httpx.AsyncClient) -> None:
    none = await client.get("/v2.1/flavors", headers=ADMIN)
    assert none.headers["OpenStack-API-Version"] == "compute 2.1"
    latest = await client.get("/v2.1/flavors", headers=at("latest"))
    assert latest.headers["X-OpenStack-Nova-API-Version"] == str(MAX_VERSION)
    legacy = await client.get(
        "/v2.1/flavors", headers={**ADMIN, "X-OpenStack-Nova-API-Version": "2.55"}
    )
    assert legacy.headers["OpenStack-API-Version"] == "compute 2.55"
    assert "description" in legacy.json()["flavors"][0]
    too_new = await client.get("/v2.1/flavors", headers=at(f"2.{MAX_VERSION.minor + 1}"))
    assert too_new.status_code == 406
    assert too_new.json()["notAcceptable"]["code"] == 406
    malformed = await client.get("/v2.1/flavors", headers=at("2.a"))
    assert malformed.status_code == 400
    assert malformed.json()["badRequest"]["code"] == 400


async def test_json_whatever_the_client_accepts(client: httpx.AsyncClient) -> None:
    response = await client.get("/v2.1/flavors/1", headers={**ADMIN, "Accept": ""})
    assert response.headers["content-type"] == "application/json"
    missing = await client.get("/v2.1/flavors/404", headers={**ADMIN, "Accept": "text/html"})
    assert missing.json()["itemNotFound"]["message"] == "Flavor 404 could not be found."
