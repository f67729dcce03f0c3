"""Tokens validated by Keystone: cached for a bounded time, revocations honoured within
it, a Keystone outage answered with 503 for tokens not cached."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.api.http.faults import Fault
from services.api.keystone.client import KeystoneClient, KeystoneRefused
from services.api.keystone.tokens import KeystoneTokens
from shared.config import IdentitySettings, Settings
from tests.unit.services.api.keystone.fake_keystone import SETTINGS, FakeKeystone

CACHE_TIME = 300.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def keystone() -> FakeKeystone:
    fake = FakeKeystone()
    fake.issue("alice")
    return fake


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def tokens(keystone: FakeKeystone, clock: Clock) -> AsyncIterator[KeystoneTokens]:
    async with keystone.client() as http:
        yield KeystoneTokens(KeystoneClient(SETTINGS, http), CACHE_TIME, clock=clock)


async def status_of(tokens: KeystoneTokens, token: str) -> int:
    try:
        found = await tokens.identify(token)
    except Fault as fault:
        return fault.code
    return 200 if found is not None else 401


async def test_a_valid_token_carries_keystones_user_project_and_roles(
    tokens: KeystoneTokens,
) -> None:
    info = await tokens.identify("alice")
    assert info is not None
    assert (info.user_id, info.project_id, info.roles) == (
        "user-of-alice",
        "p1",
        ["member", "reader"],
    )
    assert await tokens.identify("mallory") is None


async def test_a_revoked_token_is_refused_once_the_cache_time_has_passed(
    tokens: KeystoneTokens, keystone: FakeKeystone, clock: Clock
) -> None:
    assert await status_of(tokens, "alice") == 200
    del keystone.tokens["alice"]
    clock.now += CACHE_TIME - 1
    assert await status_of(tokens, "alice") == 200
    clock.now += 1
    assert await status_of(tokens, "alice") == 401


async def test_an_outage_serves_cached_tokens_until_they_expire_and_503_otherwise(
    tokens: KeystoneTokens, keystone: FakeKeystone, clock: Clock
) -> None:
    keystone.issue("bob")
    assert await status_of(tokens, "alice") == 200
    keystone.down = True
    assert await status_of(tokens, "alice") == 200
    assert await status_of(tokens, "bob") == 503
    clock.now += CACHE_TIME
    assert await status_of(tokens, "alice") == 503
    keystone.down = False
    assert await status_of(tokens, "alice") == 200
    assert await status_of(tokens, "bob") == 200


async def test_a_connection_broken_once_is_tried_again_but_not_twice(
    tokens: KeystoneTokens, keystone: FakeKeystone
) -> None:
    keystone.issue("bob")
    keystone.broken_connections = 1
    assert await status_of(tokens, "alice") == 200
    keystone.broken_connections = 2
    assert await status_of(tokens, "bob") == 503
    assert await status_of(tokens, "bob") == 200


async def test_a_token_is_not_trusted_past_its_own_expiry(
    tokens: KeystoneTokens, keystone: FakeKeystone, clock: Clock
) -> None:
    keystone.issue("short", lifetime=30)
    assert await status_of(tokens, "short") == 200
    del keystone.tokens["short"]
    clock.now += 31
    assert await status_of(tokens, "short") == 401


async def test_invalid_answers_are_cached_too(
    tokens: KeystoneTokens, keystone: FakeKeystone, clock: Clock
) -> None:
    assert await status_of(tokens, "later") == 401
    keystone.issue("later")
    assert await status_of(tokens, "later") == 401
    clock.now += CACHE_TIME
    assert await status_of(tokens, "later") == 200


async def test_concurrent_requests_with_one_token_make_one_validation(
    tokens: KeystoneTokens, keystone: FakeKeystone
) -> None:
    statuses = await asyncio.gather(*(status_of(tokens, "alice") for _ in range(20)))
    assert statuses == [200] * 20
    assert keystone.validations == 1


async def test_no_cache_time_asks_keystone_every_time(keystone: FakeKeystone, clock: Clock) -> None:
    async with keystone.client() as http:
        tokens = KeystoneTokens(KeystoneClient(SETTINGS, http), 0, clock=clock)
        assert await status_of(tokens, "alice") == 200
        del keystone.tokens["alice"]
        assert await status_of(tokens, "alice") == 401


async def test_a_token_without_a_project_is_refused_with_403(
    tokens: KeystoneTokens, keystone: FakeKeystone
) -> None:
    keystone.issue("unscoped", project=None)
    assert await status_of(tokens, "unscoped") == 403


async def test_an_expired_service_token_is_replaced(
    tokens: KeystoneTokens, keystone: FakeKeystone
) -> None:
    assert await status_of(tokens, "alice") == 200
    keystone.service_valid = False
    keystone.issue("bob")
    assert await status_of(tokens, "bob") == 200
    assert keystone.service_tokens_issued == 2


async def test_a_service_user_that_may_not_validate_is_503(
    tokens: KeystoneTokens, keystone: FakeKeystone
) -> None:
    keystone.forbid_validation = True
    assert await status_of(tokens, "alice") == 503


async def test_refused_service_credentials_are_said_at_once(keystone: FakeKeystone) -> None:
    wrong = IdentitySettings(
        keystone_url="http://keystone.test:5000/v3/",
        keystone_username="keel",
        keystone_password="wrong",
    )
    async with keystone.client() as http:
        client = KeystoneClient(wrong, http)
        assert client.url == "http://keystone.test:5000/v3"
        with pytest.raises(KeystoneRefused, match="service credentials"):
            await client.service_token()


async def test_the_cache_is_bounded_and_sighup_empties_it(
    keystone: FakeKeystone, clock: Clock
) -> None:
    async with keystone.client() as http:
        tokens = KeystoneTokens(KeystoneClient(SETTINGS, http), 60, max_entries=5, clock=clock)
        for number in range(12):
            await tokens.identify(f"t{number}")
        assert len(tokens) == 5
        await tokens.reload(Settings(identity=SETTINGS.model_copy(update={"token_cache_time": 9})))
        assert len(tokens) == 0
        assert tokens.cache_time == 9


async def test_projects_are_looked_up_in_keystone(
    tokens: KeystoneTokens, keystone: FakeKeystone
) -> None:
    assert await tokens.project_known("p1") is True
    assert await tokens.project_known("p2") is False
    keystone.down = True
    with pytest.raises(Fault) as raised:
        await tokens.project_known("p1")
    assert raised.value.code == 503


def test_keystone_without_service_credentials_is_a_bad_setting() -> None:
    with pytest.raises(ValueError, match="KEEL_IDENTITY__KEYSTONE_USERNAME"):
        IdentitySettings(keystone_url="http://keystone.test:5000")
