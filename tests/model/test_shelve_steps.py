"""Shelve, offload and unshelve on the model's cloud, as scripted examples: every
invariant checked after each step and at quiescence (the machine's teardown)."""

from __future__ import annotations

import pytest

from tests.model.machine import KeelMachine
from tests.model.script import A, Steps

pytestmark = pytest.mark.functional


def test_shelved_offloaded_and_unshelved_with_every_message_delivered_twice(
    m: KeelMachine,
) -> None:
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.shelve(0, "shelve")
    while s.m.deliverable():
        s.interleave(0, None, [0, 1, 0, 1, 1, 0])
    assert m.state_of(0) == ("shelved_offloaded", None, None)
    s.shelve(0, "unshelve-az")
    while s.m.deliverable():
        s.interleave(0, None, [1, 0, 1, 0, 0, 1])
    assert m.state_of(0)[:2] == ("active", None)
    m.teardown()


def test_a_copy_an_offload_could_not_destroy_never_blocks_an_unshelve_there(
    m: KeelMachine,
) -> None:
    """The driver fails to destroy the offloaded guest: the offload completes (the copy is
    no longer the server's; its host reports it as an orphan); an unshelve to that very
    host replaces it with the server's new copy."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    m.host(A).driver.fail_next.add("destroy")
    s.shelve(0, "shelve")
    s.deliver_all()
    assert m.state_of(0) == ("shelved_offloaded", None, None)
    assert m.server(0) in m.host(A).driver.guests()
    s.guest_report(A)
    s.deliver_all()
    s.api(
        "unshelve",
        "POST",
        f"/v2.1/servers/{m.server(0)}/action",
        body={"unshelve": {"host": "host0"}},
        version="2.91",
    )
    s.deliver_all()
    assert m.state_of(0) == ("active", None, "host0")
    m.teardown()
