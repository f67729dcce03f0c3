"""Rally: rally-openstack's ``NovaServers.boot_and_delete_server`` against keel.

A real keel-api, keel-conductor and keel-scheduler and a ``keel-fleet`` of ``--hosts``
simulated hosts (fake driver) run on a scratch database and exchange, with the embedded
identity. Rally (from PyPI, in a virtualenv of its own: ``make rally`` builds it from
``bench/rally-requirements.txt``) is given only an admin's password and the identity
URL, as for any OpenStack cloud. Its standard task boots a server and deletes it,
``--times`` iterations at ``--concurrency``, with the ``users`` context of Rally's sample
task (``--tenants`` projects of ``--users-per-tenant`` users each, created through keel's
Identity API and deleted again afterwards).

The cloud's default quotas are unlimited (``KEEL_QUOTA__*=-1``): Rally spreads the
concurrent boots over its projects at random, so one project may hold more than the
default ten servers at a time. Prints the figures of Rally's report (iterations, success
rate, iteration and atomic-action durations) as ``make bench`` scripts do, and exits 1
unless every iteration succeeded::

    .venv/bin/python bench/rally.py --venv .rally-venv --times 200 --concurrency 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchkit import report, target
from benchkit.cloud import Cloud, CloudShape, bench_cloud

from shared.db import projects, users
from shared.objects.identity import ADMIN_ROLE
from shared.passwords import hash_password

SCENARIO = "NovaServers.boot_and_delete_server"
ADMIN_NAME = "rally-admin"
UNLIMITED_QUOTAS = (
    ("KEEL_QUOTA__INSTANCES", "-1"),
    ("KEEL_QUOTA__CORES", "-1"),
    ("KEEL_QUOTA__RAM", "-1"),
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--times", type=int, default=10, help="iterations (10)")
    parser.add_argument("--concurrency", type=int, default=2, help="iterations at once (2)")
    parser.add_argument("--tenants", type=int, default=3, help="projects Rally creates (3)")
    parser.add_argument("--users-per-tenant", type=int, default=2, help="users in each (2)")
    parser.add_argument("--hosts", type=int, default=10, help="simulated hosts (10)")
    parser.add_argument("--venv", default=".rally-venv", help="Rally's virtualenv")
    parser.add_argument("--workdir", default=".rally", help="Rally's database, task and report")
    args = parser.parse_args(argv)
    args.venv, args.workdir = Path(args.venv).absolute(), Path(args.workdir).absolute()
    return args


def task(args: argparse.Namespace) -> dict[str, Any]:
    """Rally's sample task for the scenario, at the size asked for."""
    return {
        "version": 2,
        "title": "keel: boot and delete a server",
        "subtasks": [
            {
                "title": SCENARIO,
                "workloads": [
                    {
                        "scenario": {
                            SCENARIO: {
                                "flavor": {"name": "m1.tiny"},
                                "image": {"name": "cirros"},
                                "force_delete": False,
                            }
                        },
                        "runner": {
                            "constant": {"times": args.times, "concurrency": args.concurrency}
                        },
                        "contexts": {
                            "users": {
                                "tenants": args.tenants,
                                "users_per_tenant": args.users_per_tenant,
                            }
                        },
                        "sla": {"failure_rate": {"max": 0}},
                    }
                ],
            }
        ],
    }


def environment(auth_url: str, password: str, admin: str = ADMIN_NAME) -> dict[str, Any]:
    """Rally's spec of an existing OpenStack cloud: the identity URL and an admin (a
    user of that name, admin in the project of the same name)."""
    return {
        "openstack": {
            "auth_url": auth_url,
            "region_name": "RegionOne",
            "endpoint_type": "public",
            "https_insecure": False,
            "admin": {
                "username": admin,
                "password": password,
                "project_name": admin,
                "user_domain_name": "Default",
                "project_domain_name": "Default",
            },
        }
    }


def identity_url(cloud: Cloud) -> str:
    """keel's embedded identity, as Rally is given it."""
    return f"{cloud.api_url}/identity/v3"


class Rally:
    """The ``rally`` command of ``venv``, on a database and configuration in ``workdir``."""

    def __init__(self, venv: Path, workdir: Path) -> None:
        self.binary = venv / "bin" / "rally"
        self.workdir = workdir
        self.config = workdir / "rally.conf"
        self.config.write_text(
            "[DEFAULT]\n"
            f"log_dir = {workdir}\n"
            "log_file = rally.log\n"
            "[database]\n"
            f"connection = sqlite:///{workdir / 'rally.sqlite'}\n"
        )

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "OS_"))}
        env["HOME"] = str(self.workdir)
        argv = [str(self.binary), "--config-file", str(self.config), *args]
        done = subprocess.run(
            argv, cwd=self.workdir, env=env, capture_output=True, text=True, check=False
        )
        with (self.workdir / "rally-output.log").open("a") as log:
            log.write(f"$ rally {' '.join(args)}\n{done.stdout}{done.stderr}\n")
        if check and done.returncode != 0:
            raise RuntimeError(
                f"rally {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done


async def make_admin(cloud: Cloud, password: str) -> None:
    async with cloud.pool.acquire() as conn:
        project = await projects.create(conn, ADMIN_NAME, "Rally's admin")
        await users.create_in_project(
            conn, ADMIN_NAME, hash_password(password), project, ADMIN_ROLE
        )


def run_task(
    rally: Rally, environment: dict[str, Any], args: argparse.Namespace, name: str = "keel"
) -> Path:
    """Create Rally's database and an environment ``name``, run the task; its JSON report."""
    workdir = rally.workdir
    spec, task_file, report_file = (workdir / n for n in ("env.json", "task.json", "report.json"))
    spec.write_text(json.dumps(environment))
    spec.chmod(0o600)
    task_file.write_text(json.dumps(task(args), indent=2))
    rally("db", "create")
    rally("env", "create", "--name", name, "--spec", str(spec))
    started = rally("task", "start", str(task_file), check=False)
    rally("task", "report", "--json", "--out", str(report_file))
    if not report_file.exists():
        raise RuntimeError(f"rally task start did not run:\n{started.stdout}{started.stderr}")
    return report_file


def percentile(values: list[float], percent: int) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(percent / 100 * (len(ordered) - 1)))]


def figures(report_file: Path) -> tuple[dict[str, object], list[str]]:
    """The workload's figures, and the first errors of failed iterations."""
    workload = json.loads(report_file.read_text())["tasks"][0]["subtasks"][0]["workloads"][0]
    iterations = workload["data"]
    failed = [it for it in iterations if it["error"]]
    durations = [it["duration"] for it in iterations if not it["error"]]
    walls = [it["duration"] + it["idle_duration"] for it in iterations if not it["error"]]
    shown: dict[str, object] = {
        "iterations": len(iterations),
        "concurrency": workload["runner"]["constant"]["concurrency"],
        "ok": len(iterations) - len(failed),
        "failed": len(failed),
        "success_%": 100.0 * (len(iterations) - len(failed)) / max(1, len(iterations)),
        "load_s": workload["load_duration"],
        "iterations/s": len(iterations) / max(workload["load_duration"], 1e-9),
    }
    for percent in (50, 90, 99):
        shown[f"duration_p{percent}_s"] = percentile(durations, percent)
    shown["wall_p50_s"] = percentile(walls, 50)
    for action in ("nova.boot_server", "nova.delete_server"):
        took = [
            a["finished_at"] - a["started_at"]
            for it in iterations
            for a in it["atomic_actions"]
            if a["name"] == action
        ]
        shown[f"{action.removeprefix('nova.')}_p50_s"] = percentile(took, 50)
        shown[f"{action.removeprefix('nova.')}_p99_s"] = percentile(took, 99)
    errors = [" ".join(str(part) for part in it["error"][:2]) for it in failed[:3]]
    return shown, errors


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    venv, workdir = args.venv, args.workdir
    if not (venv / "bin" / "rally").exists():
        print(f"rally: {venv}/bin/rally not found: run `make rally`", file=sys.stderr)
        return 2
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    password = secrets.token_urlsafe(18)
    began = time.monotonic()
    shape = CloudShape(hosts=args.hosts, extra_env=UNLIMITED_QUOTAS)
    async with bench_cloud(shape) as cloud:
        cloud.start_fleet()
        await cloud.wait_hosts_up(args.hosts, timeout=60)
        await make_admin(cloud, password)
        rally = Rally(venv, workdir)
        spec = environment(identity_url(cloud), password)
        report_file = await asyncio.to_thread(run_task, rally, spec, args)
        async with cloud.pool.acquire() as conn:
            left = await conn.fetchval("SELECT count(*) FROM projects WHERE name <> $1", ADMIN_NAME)
    shown, errors = figures(report_file)
    shown["projects_left"] = left
    shown["whole_s"] = time.monotonic() - began
    report("rally", shown)
    for error in errors:
        print(f"rally error: {error}", file=sys.stderr)
    target("rally success %", float(str(shown["success_%"])), at_least=100.0)
    return 0 if shown["failed"] == 0 and shown["iterations"] == args.times else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
