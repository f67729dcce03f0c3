"""Usage arithmetic: hours within a period, summed per project."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.api.http.faults import BadRequest
from services.api.http.paging import page_request
from services.api.resources.usage import Period, parse_time, summarise
from tests.unit.services.api.factories import instance

START = datetime(2024, 5, 1, tzinfo=UTC)
PERIOD = Period(
    start=START,
    end=START + timedelta(days=1),
    detailed=True,
    paging=page_request(None, None),
    now=START + timedelta(hours=20),
)


def at(hours: float) -> datetime:
    return START + timedelta(hours=hours)


@pytest.mark.parametrize(
    ("launched", "terminated", "hours"),
    [
        (at(2), at(5), 3.0),
        (at(-10), at(4), 4.0),
        (at(-10), None, 20.0),  # still running: charged until now
        (at(-10), at(-1), 0.0),
        (None, None, 0.0),
    ],
)
def test_hours_within_the_period(
    launched: datetime | None, terminated: datetime | None, hours: float
) -> None:
    server = instance(launched_at=launched, terminated_at=terminated)
    assert PERIOD.hours(server) == pytest.approx(hours)


def test_totals_per_project() -> None:
    servers = [
        instance(launched_at=at(0), terminated_at=at(2)),
        instance(launched_at=at(0), terminated_at=at(1), project_id="other"),
        instance(launched_at=at(1), terminated_at=at(4)),
    ]
    [team, other] = summarise(servers, PERIOD)
    assert team["tenant_id"] == "team"
    assert team["total_hours"] == pytest.approx(5.0)
    assert team["total_memory_mb_usage"] == pytest.approx(5 * 512)
    assert team["total_local_gb_usage"] == pytest.approx(5 * 1)
    assert len(team["server_usages"]) == 2
    assert other["total_vcpus_usage"] == pytest.approx(1.0)


def test_times_are_iso_8601_and_utc_unless_said() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert parse_time(None, now) == now
    assert parse_time("2024-05-01T00:00:00", now) == START
    assert parse_time("2024-05-01 02:00:00+02:00", now) == START
    with pytest.raises(BadRequest):
        parse_time("May first", now)
