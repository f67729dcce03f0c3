"""``make test``'s lanes: every tier in one lane, lanes at once, the first red one stops all."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from devkit.lanes import Run, parse_lanes, run_lanes

#: Tiers of a scratch Makefile: each writes when it ran to a file, ``slow`` for a while.
MAKEFILE = """\
test-quick:
\techo quick said this; echo quick >> ran
test-slow:
\tsleep 30; echo slow >> ran
test-other:
\techo other >> ran
test-red:
\techo red >> ran; exit 3
"""


def test_lanes_are_words_of_tiers_joined_by_commas() -> None:
    assert parse_lanes(["unit,functional", "", "tempest,"]) == [
        ["unit", "functional"],
        ["tempest"],
    ]


@pytest.mark.parametrize(
    ("words", "error"),
    [
        (["unit,e2e", "e2e"], "a tier in two lanes or twice in one: e2e"),
        (["unit"], "tiers in no lane: e2e"),
        (["unit,e2e,bogus"], "not tiers (see make tiers): bogus"),
    ],
)
def test_lanes_that_leave_out_or_repeat_a_tier_are_refused(words: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_lanes(words, ["unit", "e2e"])


def scratch(tmp_path: Path) -> Run:
    (tmp_path / "Makefile").write_text(MAKEFILE)
    return Run(make=("make", "-s"), cwd=tmp_path, logs=tmp_path / "logs")


async def test_every_tier_runs_and_each_log_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = scratch(tmp_path)
    assert await run_lanes([["quick"], ["other"]], run) == 0
    assert sorted((tmp_path / "ran").read_text().split()) == ["other", "quick"]
    assert (tmp_path / "logs" / "quick.log").read_text() == "quick said this\n"
    out = capsys.readouterr().out
    assert "=== make test-quick (0s, passed)\nquick said this\n" in out
    assert "not run" not in out


async def test_the_first_red_tier_stops_the_other_lanes_and_its_status_is_the_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = scratch(tmp_path)
    began = time.monotonic()
    status = await run_lanes([["slow", "other"], ["red", "quick"]], run)
    assert status == 2  # make's, for a recipe that failed
    assert time.monotonic() - began < 20  # the slow tier was stopped, not waited for
    assert (tmp_path / "ran").read_text().split() == ["red"]
    out = capsys.readouterr().out
    assert "make test-red" in out
    assert "FAILED (2)" in out
    assert "not run or stopped: slow, other, quick" in out


async def test_a_run_started_with_sigint_ignored_still_stops_the_other_lanes(
    tmp_path: Path,
) -> None:
    """A run in the background of a shell without job control (``.ci/run &`` in a
    script) inherits SIGINT ignored; its tiers must not, or the stop waits them out."""
    run = scratch(tmp_path)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        began = time.monotonic()
        status = await run_lanes([["slow"], ["red"]], run)
    finally:
        signal.signal(signal.SIGINT, before)
    assert status == 2
    assert time.monotonic() - began < 20
