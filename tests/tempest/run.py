"""``make tempest``: OpenStack's Tempest compute API tests against a keel cloud of its own.

Starts a whole cloud with the end-to-end harness (its own database, exchange and API
port, so it never meets ``make run``'s), creates Tempest's admin account (Tempest makes
every other account through the Identity API: dynamic credentials) and a second image,
writes ``tempest.conf`` (see :mod:`tests.tempest.config`), runs ``tempest run`` over the
tests of ``include.txt`` less those of ``exclude.txt`` (each with its reason), and ends
with ``N passed, N failed, N skipped``. Exits non-zero when a test failed or none ran.
Tempest runs from its own virtualenv (``make tempest`` builds it from
``requirements.txt``).

    python -m tests.tempest.run [--regex REGEX] [--concurrency N] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from shared.db import images, projects, users
from shared.objects.identity import ADMIN_ROLE
from shared.passwords import hash_password
from tests.e2e.cloud import CIRROS_ID, Cloud, CloudConfig, running_cloud
from tests.tempest import config

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include.txt"
EXCLUDE = HERE / "exclude.txt"
ALT_IMAGE_ID = uuid.UUID("c1770500-0000-4000-8000-0000000a17c2")
COMPUTES = ("compute1", "compute2")

#: Room for every server Tempest builds at once: the local driver takes no real memory.
CLOUD = CloudConfig(
    computes=COMPUTES,
    vcpus=64,
    memory_mb=262144,
    local_gb=4000,
    service_down_time=30,
    env=(("KEEL_REPORT_INTERVAL", "3"),),
)

TOTAL = re.compile(r"^\s*-\s*(Passed|Failed|Skipped|Expected Fail|Unexpected Success):\s*(\d+)")


@dataclass(frozen=True)
class Totals:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @classmethod
    def parse(cls, output: str) -> Totals:
        """The counts of stestr's ``Totals`` block; unexpected successes count as failures."""
        found: dict[str, int] = {}
        for line in output.splitlines():
            match = TOTAL.match(line)
            if match:
                found[match.group(1)] = int(match.group(2))
        return cls(
            passed=found.get("Passed", 0) + found.get("Expected Fail", 0),
            failed=found.get("Failed", 0) + found.get("Unexpected Success", 0),
            skipped=found.get("Skipped", 0),
        )

    def line(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"


async def provision(cloud: Cloud, admin: config.Admin) -> None:
    """Create Tempest's admin (every other account it makes itself) and the second image."""
    async with cloud.pool.acquire() as conn:
        project = await projects.create(conn, admin.project, "Tempest's admin")
        await users.create_in_project(
            conn, admin.username, hash_password(admin.password), project, ADMIN_ROLE
        )
        await images.create(conn, image_id=ALT_IMAGE_ID, name="cirros-alt", min_disk=1)


def include_list(regex: str | None, workdir: Path) -> Path:
    """``include.txt``, or with ``regex`` a copy whose every line also requires it.

    (Tempest ORs ``--regex`` with the include list, so a slice needs its own list.)
    """
    if not regex:
        return INCLUDE
    lines = [line.split("#")[0].strip() for line in INCLUDE.read_text().splitlines()]
    sliced = workdir / "include-slice.txt"
    sliced.write_text("".join(f"(?={line})(?=.*(?:{regex}))\n" for line in lines if line))
    return sliced


def tempest_argv(tempest: Path, conf: Path, args: argparse.Namespace, listing: bool) -> list[str]:
    include = include_list(args.regex, conf.parent)
    argv = [str(tempest), "run", "--config-file", str(conf), "--include-list", str(include)]
    argv += ["--exclude-list", str(EXCLUDE)]
    if listing:
        argv.append("--list-tests")
    else:
        argv += ["--concurrency", str(args.concurrency)]
    return argv


def tempest_env(tempest: Path) -> dict[str, str]:
    """Tempest's environment: its virtualenv first on the PATH, no keel or client settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "OS_"))}
    env["PATH"] = f"{tempest.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = str(tempest.parent / "python")
    return env


def count_listed(argv: list[str], cwd: Path) -> int:
    listed = subprocess.run(
        argv, cwd=cwd, env=tempest_env(Path(argv[0])), capture_output=True, text=True, check=False
    )
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("tempest."))


def run_tempest(tempest: Path, conf: Path, args: argparse.Namespace, cwd: Path) -> str:
    """Run Tempest, echoing its output as it goes; its whole output."""
    argv = tempest_argv(tempest, conf, args, listing=False)
    print("keel-tempest:", " ".join(argv), flush=True)
    lines: list[str] = []
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=tempest_env(tempest),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            lines.append(line)
    return "".join(lines)


def excluded_count(tempest: Path, conf: Path, args: argparse.Namespace, cwd: Path) -> int:
    """How many included tests the exclude list takes out."""
    with_exclusions = tempest_argv(tempest, conf, args, listing=True)
    without = [a for a in with_exclusions if a not in ("--exclude-list", str(EXCLUDE))]
    return count_listed(without, cwd) - count_listed(with_exclusions, cwd)


def fresh_workdir(path: str) -> Path:
    """``path`` emptied, with ``run/`` (Tempest's cwd) and ``cloud/`` (keel's state)."""
    workdir = Path(path).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "run").mkdir(parents=True)
    (workdir / "cloud").mkdir()
    return workdir


def main(args: argparse.Namespace) -> int:
    tempest = Path(args.venv).absolute() / "bin" / "tempest"
    if not tempest.exists():
        print(f"keel-tempest: {tempest} not found: run `make tempest`", file=sys.stderr)
        return 2
    return asyncio.run(run(args, tempest, fresh_workdir(args.workdir)))


async def run(args: argparse.Namespace, tempest: Path, workdir: Path) -> int:
    admin = config.Admin("tempest-admin", "tempest-admin", secrets.token_urlsafe(18))
    started = time.monotonic()
    async with running_cloud(workdir / "cloud", CLOUD) as cloud:
        await provision(cloud, admin)
        conf = workdir / "tempest.conf"
        described = config.Cloud(
            api_url=cloud.api_url,
            image_ref=str(CIRROS_ID),
            image_ref_alt=str(ALT_IMAGE_ID),
            flavor_ref="1",
            flavor_ref_alt="2",
            compute_nodes=len(COMPUTES),
        )
        conf.write_text(config.tempest_conf(described, workdir, admin), encoding="utf-8")
        conf.chmod(0o600)
        print(f"keel-tempest: cloud at {cloud.api_url}, state in {workdir}", flush=True)
        output = await asyncio.to_thread(run_tempest, tempest, conf, args, workdir / "run")
    # Listing needs the test repository the run made.
    excluded = await asyncio.to_thread(excluded_count, tempest, conf, args, workdir / "run")
    totals = Totals.parse(output)
    print(f"keel-tempest: {excluded} excluded (tests/tempest/exclude.txt)")
    print(f"keel-tempest: {time.monotonic() - started:.0f}s")
    print(totals.line())
    return 1 if totals.failed or not totals.passed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regex", help="only the included tests matching this regex")
    parser.add_argument("--concurrency", type=int, default=2, help="Tempest workers")
    parser.add_argument("--workdir", default=".tempest", help="state, logs and config")
    parser.add_argument("--venv", default=".tempest-venv", help="Tempest's virtualenv")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
