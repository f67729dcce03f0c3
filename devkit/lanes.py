"""Run the test tiers in lanes: the tiers of a lane one after another, the lanes at once.

``make test`` runs ``python -m devkit.lanes LANE...``, each ``LANE`` a comma-separated
list of tiers (``make tiers`` names them all). Tiers that mostly wait — for a cloud's
processes, for Tempest's polling — overlap well; the functional and e2e tiers are
CPU-bound on two cores, and beside another lane they take longer. Each tier is
``make test-<tier>``; its output goes to ``.keel/tier-logs/<tier>.log`` and is printed
whole when the tier ends, so two tiers' lines never interleave. The first tier that
fails stops every lane (the tiers running are interrupted as by Ctrl-C, then killed
after :data:`STOP_GRACE` seconds; the ones not started are not run) and the run exits
with its status. The seconds each tier took are printed at the end, with what was left
unrun.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devkit import ROOT

LOGS = ROOT / ".keel" / "tier-logs"
#: Seconds an interrupted tier has to tear down and end before it is killed.
STOP_GRACE = 60.0


@dataclass
class Run:
    """What the lanes did: each tier's seconds and status, in the order they ended.
    ``make``: the command a tier is run with (its last word ``test-<tier>``), in ``cwd``;
    ``logs``: where each tier's output is kept."""

    make: tuple[str, ...] = ("make", "--no-print-directory")
    cwd: Path = ROOT
    logs: Path = LOGS
    ended: list[tuple[str, float, int]] = field(default_factory=list)
    failed: tuple[str, int] | None = None
    running: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)


def parse_lanes(words: Sequence[str], every: Sequence[str] = ()) -> list[list[str]]:
    """``["unit,functional", "tempest"]`` → ``[["unit", "functional"], ["tempest"]]``;
    each tier of ``every`` must be in exactly one lane, and no other tier may be."""
    lanes = [[tier for tier in word.split(",") if tier] for word in words]
    lanes = [lane for lane in lanes if lane]
    tiers = [tier for lane in lanes for tier in lane]
    repeated = sorted({tier for tier in tiers if tiers.count(tier) > 1})
    if repeated:
        raise ValueError(f"a tier in two lanes or twice in one: {', '.join(repeated)}")
    if every:
        missing = [tier for tier in every if tier not in tiers]
        unknown = [tier for tier in tiers if tier not in every]
        if missing:
            raise ValueError(f"tiers in no lane: {', '.join(missing)}")
        if unknown:
            raise ValueError(f"not tiers (see make tiers): {', '.join(unknown)}")
    return lanes


def _print_log(tier: str, path: Path, seconds: float, status: int) -> None:
    verdict = "passed" if status == 0 else f"FAILED ({status})"
    sys.stdout.write(f"\n=== make test-{tier} ({seconds:.0f}s, {verdict})\n")
    sys.stdout.write(path.read_text(errors="replace"))
    sys.stdout.flush()


async def _tier(tier: str, run: Run) -> int:
    run.logs.mkdir(parents=True, exist_ok=True)
    path = run.logs / f"{tier}.log"
    began = time.monotonic()
    with path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *run.make, f"test-{tier}",
            cwd=run.cwd, stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            preexec_fn=_interruptible,
        )  # fmt: skip
        run.running[tier] = process
        try:
            status = await process.wait()
        finally:
            del run.running[tier]
    seconds = time.monotonic() - began
    if tier in run.stopped:
        sys.stdout.write(f"\n=== make test-{tier}: stopped after {seconds:.0f}s (another failed)\n")
        return status
    run.ended.append((tier, seconds, status))
    _print_log(tier, path, seconds, status)
    return status


def _interruptible() -> None:
    """In a tier's process, before its command: SIGINT as by default. A run started in
    the background of a shell without job control (``cmd &`` in a script) inherits
    SIGINT ignored, and so would every tier: :func:`_stop_all` could not stop one."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_all(run: Run) -> None:
    # SIGINT, as Ctrl-C: pytest stops and tears its fixtures down, the clouds they
    # started (in sessions of their own) included.
    for tier, process in run.running.items():
        run.stopped.add(tier)
        try:
            os.killpg(process.pid, signal.SIGINT)
        except ProcessLookupError:
            continue


async def _kill_stragglers(run: Run) -> None:
    waiting = [process.wait() for process in run.running.values()]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*waiting), STOP_GRACE)
    for process in list(run.running.values()):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


async def _lane(tiers: list[str], run: Run) -> None:
    for tier in tiers:
        if run.failed is not None:
            return
        status = await _tier(tier, run)
        if status != 0 and run.failed is None and tier not in run.stopped:
            run.failed = (tier, status)
            _stop_all(run)
            await _kill_stragglers(run)


def summary(lanes: list[list[str]], run: Run, total: float) -> str:
    lines = ["", "=== tiers (seconds, in the order they ended)"]
    for tier, seconds, status in run.ended:
        verdict = "passed" if status == 0 else f"FAILED ({status})"
        lines.append(f"make test-{tier:<12} {seconds:6.0f}s  {verdict}")
    done = {tier for tier, _, _ in run.ended}
    unrun = [tier for lane in lanes for tier in lane if tier not in done]
    if unrun:
        lines.append(f"not run or stopped: {', '.join(unrun)}")
    lines.append(f"lanes: {' | '.join(' '.join(lane) for lane in lanes)}; total {total:.0f}s")
    return "\n".join(lines) + "\n"


async def run_lanes(lanes: list[list[str]], run: Run | None = None) -> int:
    run = run or Run()
    began = time.monotonic()
    await asyncio.gather(*(_lane(lane, run) for lane in lanes))
    sys.stdout.write(summary(lanes, run, time.monotonic() - began))
    if run.failed is not None:
        tier, status = run.failed
        sys.stdout.write(f"make test-{tier} failed: the other lanes were stopped\n")
        return status
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("lanes", nargs="+", help="a lane: tiers separated by commas")
    parser.add_argument("--tiers", default="", help="every tier, each to be in one lane")
    args = parser.parse_args(argv)
    try:
        lanes = parse_lanes(args.lanes, args.tiers.split())
    except ValueError as exc:
        parser.error(str(exc))
    return asyncio.run(run_lanes(lanes))


if __name__ == "__main__":
    sys.exit(main())
