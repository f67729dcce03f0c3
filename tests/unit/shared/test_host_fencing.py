"""When a silent compute host's guests count as off (``shared.host_fencing``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.config import FencingSettings, Settings, load_settings
from shared.exceptions import ConfigError
from shared.host_fencing import fence_state, stray_copy_may_run
from shared.objects.service import Service
from shared.versions import HOST_FENCE_VERSION
from tests.unit.services.api.factories import service

DOWN, LEASE, MARGIN = 4.0, 8.0, 2.0


def down(**changes: object) -> Service:
    fields: dict[str, object] = {
        "host": "cn1",
        "binary": "keel-compute",
        "is_up": False,
        "forced_down": False,
        "version": HOST_FENCE_VERSION,
        "self_fence_after": LEASE,
        "fence_lease": LEASE,
    }
    return service(**{**fields, **changes})


def state(svc: Service, silent: float | None) -> tuple[bool, float | None, str]:
    found = fence_state(svc, silent, down_time=DOWN, margin=MARGIN)
    return found.fenced, found.seconds_left, found.why


def test_a_host_without_an_armed_fence_forced_down_is_fenced_at_once() -> None:
    svc = down(forced_down=True, fence_lease=None, version=1)
    fenced, left, why = state(svc, 0.0)
    assert fenced
    assert left is None
    assert "forced down by an operator" in why
    assert fence_state(svc, 0.0, down_time=DOWN, margin=MARGIN).guests_off


def test_a_host_with_an_armed_fence_forced_down_waits_for_its_lease() -> None:
    """Accepted at once, but no new copy before the fence has certainly fired."""
    found = fence_state(down(forced_down=True), 1.0, down_time=DOWN, margin=MARGIN)
    assert found.fenced
    assert not found.guests_off
    assert found.seconds_left == pytest.approx(LEASE + MARGIN - 1.0)
    assert "runs out only 9s from now" in found.why

    later = fence_state(down(forced_down=True), LEASE + MARGIN, down_time=DOWN, margin=MARGIN)
    assert later.guests_off
    assert "its fence's lease of 8s ran out" in later.why


def test_a_forced_down_host_whose_agent_still_renews_its_lease_waits() -> None:
    """Forced down but heartbeating: the guests run; the wait never ends by itself."""
    found = fence_state(down(forced_down=True, is_up=False), 0.5, down_time=DOWN, margin=MARGIN)
    assert not found.guests_off


def test_an_up_host_is_still_in_use() -> None:
    fenced, _, why = state(down(is_up=True), 1.0)
    assert not fenced
    assert why == "Compute service of cn1 is still in use."


def test_a_silent_host_is_fenced_once_its_lease_and_the_margin_have_passed() -> None:
    found = fence_state(down(), LEASE + MARGIN, down_time=DOWN, margin=MARGIN)
    assert found.fenced
    assert found.guests_off
    fenced, left, why = state(down(), LEASE + MARGIN - 3.5)
    assert not fenced
    assert left == pytest.approx(3.5)
    assert "evacuated 4s from now" in why


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"fence_lease": None}, "no armed host fence"),
        ({"fence_lease": 0.0}, "no armed host fence"),
        ({"version": HOST_FENCE_VERSION - 1}, "release painter"),
    ],
)
def test_a_host_without_an_armed_fence_never_is_fenced_by_time(
    changes: dict[str, object], says: str
) -> None:
    """Fencing off, a fence dead at the last heartbeat, an agent before fences: a dead
    agent's host may run its guests for ever."""
    fenced, left, why = state(down(**changes), 10**6)
    assert not fenced
    assert left is None
    assert says in why
    assert "openstack compute service set --down" in why


def test_a_host_that_never_heartbeat_must_be_forced_down() -> None:
    fenced, left, why = state(down(fence_lease=None), None)
    assert not fenced
    assert left is None
    assert "never sent a heartbeat" in why


def test_the_lease_defaults_to_twice_the_down_time_and_0_disables_it() -> None:
    assert Settings(service_down_time=30).self_fence_after == 60
    assert Settings(fencing=FencingSettings(self_fence_after=0)).self_fence_after == 0


def test_a_lease_within_two_heartbeats_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_REPORT_INTERVAL", "5")
    monkeypatch.setenv("KEEL_FENCING__SELF_FENCE_AFTER", "10")
    with pytest.raises(ConfigError, match="longer than twice KEEL_REPORT_INTERVAL"):
        load_settings()


ENDED = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def test_a_stray_copy_may_run_until_its_hosts_fence_lease_ran_out() -> None:
    hour_ago = ENDED - timedelta(hours=1)
    assert stray_copy_may_run(down(last_seen_up=hour_ago), LEASE, margin=MARGIN)
    assert not stray_copy_may_run(down(last_seen_up=hour_ago), LEASE + MARGIN, margin=MARGIN)
    assert not stray_copy_may_run(down(is_up=True), 0.5, margin=MARGIN)


def test_forced_down_is_the_operators_word_only_without_an_armed_fence() -> None:
    assert not stray_copy_may_run(down(forced_down=True, fence_lease=None), 1.0, margin=MARGIN)
    assert stray_copy_may_run(down(forced_down=True), 1.0, margin=MARGIN)
    assert stray_copy_may_run(down(fence_lease=None), 10**6, margin=MARGIN)


def test_a_stray_copy_is_off_once_the_agent_heartbeated_after_the_move_ended() -> None:
    # The agent reports (and stops) such copies before its first heartbeat.
    before, after = ENDED - timedelta(seconds=1), ENDED + timedelta(seconds=1)
    unarmed = {"fence_lease": None}
    assert stray_copy_may_run(down(last_seen_up=before, **unarmed), 1, margin=1, ended_at=ENDED)
    assert stray_copy_may_run(down(last_seen_up=None, **unarmed), None, margin=1, ended_at=ENDED)
    assert not stray_copy_may_run(down(last_seen_up=after, **unarmed), 1, margin=1, ended_at=ENDED)


def test_by_default_losing_a_broker_node_fits_well_inside_the_fences_lease() -> None:
    """A frozen node is noticed after three AMQP heartbeats: at RabbitMQ's own 60 s that
    is three minutes, longer than the lease, and every agent on it would fence its host."""
    settings = Settings()
    assert settings.broker_failover() <= settings.self_fence_after / 2
    brokers_own = Settings(transport_url="amqp://guest:guest@localhost:5672/?heartbeat=60")
    assert brokers_own.broker_failover() > brokers_own.self_fence_after
