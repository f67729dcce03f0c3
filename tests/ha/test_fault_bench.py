"""bench/faults.py, run tiny: it completes and prints its figures for each fault it ran.

Timings are not judged here (they are the benchmark's to print); what must hold whatever
the timing is checked: nothing lost, duplicated or stuck, no keel process exited that
the fault did not kill.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from devkit import ROOT
from devkit.environment import with_devkit

pytestmark = [pytest.mark.ha, pytest.mark.timeout(900)]

FAULTS = ("broker-kill", "kill-api")
FIGURES = (
    "downtime_s",
    "mttr_s",
    "median_before_s",
    "iterations",
    "accepted",
    "lost",
    "duplicated",
    "stuck",
    "unplanned_exits",
)


def test_faults_runs_tiny_and_prints_every_figure() -> None:
    result = subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "faults.py"), "--faults", ",".join(FAULTS),
            "--clients", "3", "--hosts", "2", "--before", "8", "--after", "12",
        ],
        env=with_devkit(os.environ),
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    records: list[dict[str, Any]] = [
        json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")
    ]
    for fault in FAULTS:
        [line] = [r for r in records if r["bench"] == fault]
        assert all(figure in line for figure in FIGURES), line
        assert line["iterations"] > 0
        assert line["lost"] == line["duplicated"] == line["stuck"] == 0, line
        assert line["unplanned_exits"] == "none", line
        verdicts = [r for r in records if r["bench"] == "target" and r["name"].startswith(fault)]
        assert len(verdicts) == 4
