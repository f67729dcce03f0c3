"""The model-based search at length: several pytest processes, each from a seed of its own.

``make test-model`` runs this. Each worker runs ``tests/model/test_model.py`` with
``KEEL_MODEL_EXAMPLES`` (its share of the examples) and ``KEEL_MODEL_SEED`` (a new random
seed, or the one given to run a search again), on a scratch database of its own. At the
end it prints each worker's seed, examples and time, and the examples per second of the
whole search; a worker that found a broken invariant has its report printed, with the
seed that reproduces it (``make test-model SEED=…``), and the run fails.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: What test_model.py prints at its end: "model: 315 examples in 55.5s, 5.7 examples/s".
_RAN = re.compile(r"model: (\d+) examples in ([\d.]+)s")


@dataclass
class Worker:
    seed: int
    examples: int
    log: Path
    process: subprocess.Popen[bytes]

    def ran(self) -> tuple[int, float] | None:
        found = _RAN.findall(self.log.read_text(errors="replace"))
        if not found:
            return None
        examples, seconds = found[-1]
        return int(examples), float(seconds)


def start(seed: int, examples: int, log: Path, extra: list[str]) -> Worker:
    env = {**os.environ, "KEEL_MODEL_EXAMPLES": str(examples), "KEEL_MODEL_SEED": str(seed)}
    command = [sys.executable, "-m", "pytest", "tests/model/test_model.py", "-q", "-s"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, *extra], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return Worker(seed, examples, log, process)


def _random_seed(number: int) -> int:
    """A new seed for worker ``number``: even for even workers, odd for odd ones, so a
    search of two workers or more runs both profiles (an even seed runs with soft
    delete on, an odd one with it off: ``tests/model/machine.py``)."""
    return (secrets.randbelow(2**31) << 1) | (number % 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="in all (default 5000)")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes (default: CPUs)"
    )
    parser.add_argument("--seed", type=int, default=None, help="run this seed's search again")
    parser.add_argument("--logs", type=Path, default=Path(".keel/model"), help="worker logs")
    parser.add_argument("pytest_args", nargs="*", help="passed to each pytest")
    args = parser.parse_args(argv)
    if args.examples < 1 or args.workers < 1:
        parser.error("--examples and --workers must be at least 1")

    workers_wanted = 1 if args.seed is not None else min(args.workers, args.examples)
    share = math.ceil(args.examples / workers_wanted)
    args.logs.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    workers = []
    for number in range(workers_wanted):
        seed = args.seed if args.seed is not None else _random_seed(number)
        log = args.logs / f"worker-{number}.log"
        workers.append(start(seed, share, log, args.pytest_args))
        print(f"model search: worker {number}: seed {seed}, {share} examples, log {log}")
    sys.stdout.flush()
    try:
        for worker in workers:
            worker.process.wait()
    except KeyboardInterrupt:
        for worker in workers:
            worker.process.terminate()
        raise
    wall = time.monotonic() - began

    total = 0
    failed = [w for w in workers if w.process.returncode != 0]
    for number, worker in enumerate(workers):
        ran = worker.ran()
        examples, seconds = ran if ran is not None else (0, 0.0)
        total += examples
        verdict = "passed" if worker.process.returncode == 0 else "FAILED"
        print(
            f"model search: worker {number}: seed {worker.seed}: {examples} examples "
            f"in {seconds:.1f}s: {verdict}"
        )
    for worker in failed:
        print(f"\n--- seed {worker.seed} (again: make test-model SEED={worker.seed}) ---")
        print(worker.log.read_text(errors="replace")[-20000:])
    rate = total / wall if wall > 0 else 0.0
    print(
        f"model search: {total} examples in {wall:.1f}s over {len(workers)} worker(s): "
        f"{rate:.1f} examples/s; seeds {', '.join(str(w.seed) for w in workers)}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
