"""Every benchmark, run tiny, so none can rot; the scheduler's capacity invariant each time.

Each script runs as ``make bench`` runs it (a subprocess of this Python), against the
real PostgreSQL and RabbitMQ, at a size that takes seconds; most start a whole cloud, so
they are a tier of their own (``make test-bench``), after the end-to-end tests. Timings
are never judged: the test checks that each printed its figures as JSON lines and,
wherever it claimed resources, that usage equals allocations and no node is over
capacity.
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

#: Seconds a tiny benchmark may take: what it measures is printed, never judged here, and
#: on a machine busy with other tiers a tiny run takes several times its quiet minute.
SCRIPT_TIMEOUT = 300

pytestmark = [pytest.mark.bench, pytest.mark.timeout(SCRIPT_TIMEOUT + 30)]

BENCH = ROOT / "bench"


def run(script: str, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        env=with_devkit(os.environ),
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{result.stderr}"
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def lines(records: list[dict[str, Any]], bench: str) -> list[dict[str, Any]]:
    found = [r for r in records if r["bench"] == bench]
    assert found, f"no {bench!r} line in {records}"
    return found


def assert_capacity_held(records: list[dict[str, Any]]) -> None:
    for check in lines(records, "capacity check"):
        assert check["over_capacity"] == 0, check
        assert check["usage_drift"] == 0, check
        assert check["result"] == "ok", check


def test_schedule_at_two_sizes_and_two_concurrencies() -> None:
    records = run(
        "schedule.py", "--hosts", "5", "20", "--requests", "12", "--concurrency", "1", "4"
    )
    runs = lines(records, "schedule")
    assert [(r["hosts"], r["concurrency"]) for r in runs] == [(5, 1), (5, 4), (20, 1), (20, 4)]
    assert all(r["ok"] == 12 for r in runs)
    assert_capacity_held(records)
    assert [c["allocations"] for c in lines(records, "capacity check")] == [12] * 4


def test_schedule_with_the_cache_strategy() -> None:
    records = run("schedule.py", "--strategy", "cache", "--hosts", "5", "--requests", "8")
    assert {r["strategy"] for r in lines(records, "schedule")} == {"cache"}
    assert_capacity_held(records)


def test_rpc_compares_keel_with_raw_aio_pika() -> None:
    records = run("rpc.py", "--calls", "20", "--concurrency", "1", "4", "--casts", "20")
    assert [r["concurrency"] for r in lines(records, "rpc ratio")] == [1, 4]
    assert all(r["ok"] == 20 for r in lines(records, "rpc raw aio-pika"))
    assert lines(records, "rpc cast")[0]["handled"] == 20


def test_storm() -> None:
    records = run("storm.py", "--hosts", "3")
    storm = lines(records, "storm")[0]
    assert storm["hosts"] == 3
    assert storm["fleet_rss_mb"] > 0
    # The conductor's minimum-version cache: at most one query per binary per TTL.
    verdicts = [t for t in lines(records, "target") if "min-version" in t["name"]]
    assert [v["result"] for v in verdicts] == ["PASS"]


def test_memory() -> None:
    records = run("memory.py", "--fleet-hosts", "3")
    assert lines(records, "memory agent")[0]["rss_mb"] > 0
    assert lines(records, "memory fleet")[0]["agents"] == 3
    assert len(lines(records, "memory control")) == 2


def test_login() -> None:
    records = run("login.py", "--users", "3", "--logins", "6", "--requests", "6")
    phases = {r["bench"]: r for r in records if "api_cpu_ms/request" in r}
    assert set(phases) == {"login first", "login repeated", "token check", "static token"}
    assert phases["login first"]["requests"] == 3
    assert phases["login repeated"]["requests"] == 6
    assert lines(records, "token query")[0]["find_valid_cpu_ms"] > 0
    assert [t["name"] for t in lines(records, "target")] == [
        "login: repeated password login, keel-api CPU"
    ]


def test_boot() -> None:
    records = run("boot.py", "--servers", "8", "--clients", "3", "--hosts", "2")
    boot = lines(records, "boot")[0]
    assert (boot["servers"], boot["ok"], boot["failed"]) == (8, 8, 0)
    assert boot["casts/boot"] > 0
    assert_capacity_held(records)


def test_soak() -> None:
    records = run(
        "soak.py", "--seconds", "6", "--clients", "2", "--hosts", "2", "--sample", "2",
        "--warmup", "0",
    )  # fmt: skip
    samples = lines(records, "soak sample")
    assert len(samples) >= 2
    assert all(s["conductor_rss_mb"] > 0 for s in samples)
    soak = lines(records, "soak")[0]
    assert soak["cycles"] > 0
    assert (soak["failures"], soak["claims_left"], soak["servers_left"]) == (0, 0, 0)
    assert soak["verdict"] in ("bounded", "grew")
    assert_capacity_held(records)


def test_evacuate() -> None:
    records = run("evacuate.py", "--instances", "4", "--hosts", "2", "--clients", "2")
    evacuate = lines(records, "evacuate")[0]
    assert evacuate["instances"] == 4
    assert evacuate["all_active_s"] > 0
    assert evacuate["source_memory_mb_used"] == 0
    assert_capacity_held(records)


def test_backfill() -> None:
    (record,) = run("backfill.py", "--rows", "500", "--hosts", "7")
    assert (record["rows"], record["linked"], record["wrongly_linked"]) == (500, 500, 0)
    assert record["rows/s"] > 0


def test_scratch_db() -> None:
    records = run("scratch_db.py", "--databases", "2", "--tests", "10")
    (measured,) = lines(records, "scratch database")
    assert measured["databases"] == 2
    assert measured["create_and_migrate_s"] > 0
    assert measured["template_copy_s"] > 0
    assert measured["drop_s"] > 0
    assert lines(records, "target")[0]["name"] == "template copy"
