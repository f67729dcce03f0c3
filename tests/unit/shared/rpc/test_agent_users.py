"""Per-agent broker users: names that map to service UUIDs, and permissions that fit."""

from __future__ import annotations

import re
import uuid

import pytest

from shared.rpc.agent_users import permissions, service_of, user_for

SERVICE = uuid.UUID("2f1c9a4e-5b7d-4e8f-9a0b-1c2d3e4f5a6b")
OTHER = uuid.UUID("9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b")


def test_a_user_names_its_service() -> None:
    assert user_for(SERVICE) == f"keel-compute-{SERVICE}"
    assert service_of(user_for(SERVICE)) == SERVICE


@pytest.mark.parametrize(
    "user",
    [
        None,
        "guest",
        "keel",
        "keel-compute-",
        "keel-compute-not-a-uuid",
        f"keel-compute-{SERVICE}-x",
        f"x-keel-compute-{SERVICE}",
        f"keel-compute-{str(SERVICE).upper()}",
        f"keel-compute-{SERVICE.hex}",
    ],
)
def test_other_users_are_not_agents(user: str | None) -> None:
    assert service_of(user) is None


def matches(pattern: str, name: str) -> bool:
    # RabbitMQ searches (it does not anchor): the patterns anchor themselves.
    return re.search(pattern, name) is not None


def test_an_agent_reads_and_declares_only_its_own_queue_and_replies() -> None:
    granted = permissions("keel.prod", SERVICE)
    own, other = f"keel.prod.compute.{SERVICE}", f"keel.prod.compute.{OTHER}"
    reply = f"keel.prod.reply.{uuid.uuid4()}"
    for name in (own, reply):
        assert matches(granted.configure, name)
        assert matches(granted.read, name)
    for name in (
        other,
        "keel.prod.conductor",
        "keel.prod.scheduler",
        "keel.prod.dead-letter.casts",
        "keel.prod",
        "keel.prod.dead",
        f"keel.prod.reply.{uuid.uuid4()}.x",
        f"keelXprod.compute.{SERVICE}",
        f"{own}.x",
    ):
        assert not matches(granted.configure, name), name
    for name in (other, "keel.prod.conductor", "keel.prod.dead-letter.casts", f"x{own}"):
        assert not matches(granted.read, name), name
    # Reading the exchange is what binding to it needs; which keys is a topic permission.
    assert matches(granted.read, "keel.prod")


def test_an_agent_publishes_to_the_conductor_and_binds_only_its_own_keys() -> None:
    granted = permissions("keel", SERVICE)
    [topics] = [t for t in granted.topics if t.exchange == "keel"]
    [dead] = [t for t in granted.topics if t.exchange == "keel.dead"]
    for key in ("cast.conductor", "call.conductor"):
        assert matches(topics.write, key)
    for key in ("call.scheduler", f"cast.compute.{OTHER}", "cast.conductorx", "reply.x"):
        assert not matches(topics.write, key), key
    for key in (f"cast.compute.{SERVICE}", f"call.compute.{SERVICE}"):
        assert matches(topics.read, key)
        assert matches(dead.write, key)
    for key in ("cast.conductor", f"call.compute.{OTHER}", "#", f"cast.compute.{SERVICE}.#"):
        assert not matches(topics.read, key), key
        assert not matches(dead.write, key), key
    assert not matches(dead.read, "cast.#")
    for name in ("keel", "keel.dead", "amq.default", f"keel.compute.{SERVICE}"):
        assert matches(granted.write, name)
    for name in ("keel.conductor", f"keel.compute.{OTHER}", "amq.topic"):
        assert not matches(granted.write, name), name
