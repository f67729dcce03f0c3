"""When a silent compute host counts as fenced (``shared.fencing.fence_state``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.config import FencingSettings, Settings, load_settings
from shared.exceptions import ConfigError
from shared.fencing import fence_state, stray_copy_may_run
from shared.objects.service import Service
from shared.versions import SELF_FENCING_VERSION
from tests.unit.services.api.factories import service

DOWN, FENCE, MARGIN = 4.0, 8.0, 2.0


def down(**changes: object) -> Service:
    fields: dict[str, object] = {
        "host": "cn1",
        "binary": "keel-compute",
        "is_up": False,
        "forced_down": False,
        "version": SELF_FENCING_VERSION,
        "self_fence_after": FENCE,
    }
    return service(**{**fields, **changes})


def state(svc: Service, silent: float | None) -> tuple[bool, float | None, str]:
    found = fence_state(svc, silent, down_time=DOWN, margin=MARGIN)
    return found.fenced, found.seconds_left, found.why


def test_an_operator_forcing_it_down_fences_it_at_once() -> None:
    fenced, left, why = state(down(forced_down=True, self_fence_after=None, version=1), 0.0)
    assert fenced
    assert left is None
    assert "forced down by an operator" in why


def test_an_up_host_is_still_in_use() -> None:
    fenced, _, why = state(down(is_up=True), 1.0)
    assert not fenced
    assert why == "Compute service of cn1 is still in use."


def test_a_self_fencing_host_is_fenced_past_down_time_window_and_margin() -> None:
    assert state(down(), DOWN + FENCE + MARGIN)[0]
    fenced, left, why = state(down(), DOWN + FENCE + MARGIN - 3.5)
    assert not fenced
    assert left == pytest.approx(3.5)
    assert "evacuated 4s from now" in why


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"self_fence_after": 0.0}, "KEEL_FENCING__SELF_FENCE_AFTER=0"),
        ({"self_fence_after": None}, "does not fence itself"),
        ({"version": SELF_FENCING_VERSION - 1}, "release lanyard"),
    ],
)
def test_a_host_whose_agent_does_not_fence_itself_never_is_by_time(
    changes: dict[str, object], says: str
) -> None:
    fenced, left, why = state(down(**changes), 10**6)
    assert not fenced
    assert left is None
    assert says in why
    assert "openstack compute service set --down" in why


def test_a_host_that_never_heartbeat_must_be_forced_down() -> None:
    fenced, left, why = state(down(), None)
    assert not fenced
    assert left is None
    assert "never sent a heartbeat" in why


def test_the_window_defaults_to_twice_the_down_time_and_0_disables_it() -> None:
    assert Settings(service_down_time=30).self_fence_after == 60
    assert Settings(fencing=FencingSettings(self_fence_after=0)).self_fence_after == 0


def test_a_window_within_two_heartbeats_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_REPORT_INTERVAL", "5")
    monkeypatch.setenv("KEEL_FENCING__SELF_FENCE_AFTER", "10")
    with pytest.raises(ConfigError, match="longer than twice KEEL_REPORT_INTERVAL"):
        load_settings()


ENDED = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def test_a_stray_copy_may_run_while_its_host_is_down_and_not_forced_down() -> None:
    # Ended now: only an up agent (told what to do with it) or a forced-down host is safe,
    # however long ago the agent last heartbeated: self-fencing does not count.
    assert stray_copy_may_run(down(last_seen_up=ENDED - timedelta(hours=1)))
    assert not stray_copy_may_run(down(is_up=True))
    assert not stray_copy_may_run(down(forced_down=True))


def test_a_stray_copy_is_off_once_the_agent_heartbeated_after_the_move_ended() -> None:
    # The agent reports (and stops) such copies before its first heartbeat.
    before, after = ENDED - timedelta(seconds=1), ENDED + timedelta(seconds=1)
    assert stray_copy_may_run(down(last_seen_up=before), ended_at=ENDED)
    assert stray_copy_may_run(down(last_seen_up=None), ended_at=ENDED)
    assert not stray_copy_may_run(down(last_seen_up=after), ended_at=ENDED)
    assert not stray_copy_may_run(down(last_seen_up=before, forced_down=True), ended_at=ENDED)
