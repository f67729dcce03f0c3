"""keel-api behind Keystone: Keystone's tokens open the compute API, with Keystone's
roles; no identity of keel's own is served; a Keystone outage is a 503 fault."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.api.keystone.client import KeystoneClient
from services.api.keystone.tokens import KeystoneTokens
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.rpc.fake import FakeTransport
from tests.unit.services.api.keystone.fake_keystone import SETTINGS, FakeKeystone


class _NoDatabase:
    def acquire(self) -> Any:
        raise AssertionError("behind Keystone, authentication never reaches the database")


@pytest.fixture
def keystone() -> FakeKeystone:
    fake = FakeKeystone()
    fake.issue("alice")
    return fake


@pytest.fixture
async def client(keystone: FakeKeystone) -> AsyncIterator[httpx.AsyncClient]:
    transport = FakeTransport()
    async with keystone.client() as http:
        tokens = KeystoneTokens(KeystoneClient(SETTINGS, http), 300)
        app = create_app(
            Settings(identity=SETTINGS),
            cast(asyncpg.Pool, _NoDatabase()),
            ConductorAPI(transport),
            ComputeAPI(transport),
            keystone=tokens,
        )
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
        ) as api:
            yield api


async def test_keystones_member_is_a_member_here(client: httpx.AsyncClient) -> None:
    refused = await client.get("/v2.1/os-hypervisors", headers={"X-Auth-Token": "alice"})
    assert refused.status_code == 403
    unknown = await client.get("/v2.1/os-hypervisors", headers={"X-Auth-Token": "mallory"})
    assert unknown.status_code == 401


async def test_no_identity_of_its_own(client: httpx.AsyncClient) -> None:
    for path in ("/identity", "/identity/v3", "/identity/v3/projects"):
        response = await client.get(path, headers={"X-Auth-Token": "alice"})
        assert response.status_code == 404, path
    login = await client.post("/identity/v3/auth/tokens", json={})
    assert login.status_code == 404


async def test_an_outage_is_a_503_fault_with_retry_after(
    client: httpx.AsyncClient, keystone: FakeKeystone
) -> None:
    keystone.down = True
    response = await client.get("/v2.1/os-hypervisors", headers={"X-Auth-Token": "alice"})
    assert response.status_code == 503
    assert "Keystone" in response.json()["serviceUnavailable"]["message"]
    assert int(response.headers["Retry-After"]) > 0


async def test_the_operators_page_signs_no_one_in(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/ops/login",
        content="username=admin&password=secret",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 403
    assert "set-cookie" not in response.headers
