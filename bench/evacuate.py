"""Evacuation: a host with K instances evacuated; time until all are ACTIVE elsewhere.

What is measured: a real keel-api, keel-conductor and keel-scheduler, one
``keel-fleet`` of N destination hosts and one separate ``keel-compute`` (fake driver),
the source. K servers are created on the source (the forced ``nova:HOST`` zone, as an
admin may), then its agent is stopped and its service forced down, as an operator does
when a host dies. ``--clients`` clients send ``evacuate`` for every server at once:

* **evacuate** — from the first request until every server is ACTIVE on another host;
* **confirm** — the source agent starts again and confirms every evacuation record
  (``completed``): from its start, and from its service reporting up.

Targets (500 instances): all ACTIVE within 60 s; the returning source confirms every
record within 10 s. Afterwards the capacity invariant is checked. Run it with
``make bench`` or::

    .venv/bin/python bench/evacuate.py --instances 500 --hosts 10
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

import httpx
from benchkit import report, run_load, target
from benchkit.cloud import CIRROS_ID, Cloud, CloudShape, bench_cloud
from benchkit.db import check_capacity

from shared.exceptions import BuildFailed

SOURCE = "evac-source"
POLL_S = 0.05


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--instances", type=int, default=500, help="servers on the host (500)")
    parser.add_argument("--hosts", type=int, default=10, help="destination hosts (10)")
    parser.add_argument("--clients", type=int, default=20, help="concurrent API clients (20)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after (s)")
    args = parser.parse_args(argv)
    if min(args.instances, args.hosts, args.clients) < 1:
        parser.error("every count must be at least 1")
    return args


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float) -> float:
    """Seconds until ``check`` holds; BuildFailed after ``timeout``."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise BuildFailed(f"{what} did not happen within {timeout:g}s")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - started


async def count(cloud: Cloud, sql: str, *args: object) -> int:
    async with cloud.pool.acquire() as conn:
        found: int = await conn.fetchval(sql, *args)
    return found


async def fill_source(http: httpx.AsyncClient, cloud: Cloud, args: argparse.Namespace) -> None:
    async def create(index: int) -> None:
        server = {"name": f"evac-{index}", "flavorRef": "1", "imageRef": str(CIRROS_ID)}
        body = {"server": {**server, "availability_zone": f"nova:{SOURCE}"}}
        response = await http.post("servers", json=body)
        if response.status_code != 202:
            raise BuildFailed(f"POST /servers answered {response.status_code}: {response.text}")

    created = await run_load(create, args.instances, args.clients)
    if created.failed:
        raise BuildFailed(f"creating the servers failed: {dict(created.failures)}")

    async def all_active() -> bool:
        active = await count(
            cloud, "SELECT count(*) FROM instances WHERE host = $1 AND vm_state = 'active'", SOURCE
        )
        return bool(active == args.instances)

    await until(all_active, f"{args.instances} servers ACTIVE on {SOURCE}", args.timeout)


async def lose_source(http: httpx.AsyncClient, cloud: Cloud) -> None:
    cloud.processes[SOURCE].stop()
    headers = {"OpenStack-API-Version": "compute 2.53"}
    listed = await http.get(f"os-services?host={SOURCE}&binary=keel-compute", headers=headers)
    service_id = listed.json()["services"][0]["id"]
    down = await http.put(f"os-services/{service_id}", json={"forced_down": True}, headers=headers)
    down.raise_for_status()


async def evacuate_all(
    http: httpx.AsyncClient, cloud: Cloud, args: argparse.Namespace
) -> tuple[float, float]:
    """Seconds to send every evacuate, and until every server is ACTIVE elsewhere."""
    async with cloud.pool.acquire() as conn:
        servers = [r["uuid"] for r in await conn.fetch("SELECT uuid FROM instances")]
    headers = {"OpenStack-API-Version": "compute 2.29"}
    started = time.monotonic()

    async def evacuate(index: int) -> None:
        response = await http.post(
            f"servers/{servers[index]}/action", json={"evacuate": {}}, headers=headers
        )
        if response.status_code != 200:
            raise BuildFailed(f"evacuate answered {response.status_code}: {response.text}")

    asked = await run_load(evacuate, len(servers), args.clients)
    if asked.failed:
        raise BuildFailed(f"evacuating failed: {dict(asked.failures)}")
    sent = time.monotonic() - started

    async def all_moved() -> bool:
        moved = await count(
            cloud,
            "SELECT count(*) FROM instances WHERE host <> $1 AND vm_state = 'active'"
            " AND task_state IS NULL",
            SOURCE,
        )
        return moved == len(servers)

    await until(all_moved, "every server ACTIVE elsewhere", args.timeout)
    return sent, time.monotonic() - started


async def confirm_all(cloud: Cloud, args: argparse.Namespace) -> tuple[float, float]:
    """Seconds from the source's start, and from its service being up, to every record
    ``completed``."""
    started = time.monotonic()
    cloud.start_agent(SOURCE)

    async def heartbeating() -> bool:
        return bool(
            await count(
                cloud,
                """SELECT count(*) FROM services WHERE host = $1 AND "binary" = 'keel-compute'
                      AND last_seen_up > now() - interval '2 seconds'""",
                SOURCE,
            )
        )

    async def all_completed() -> bool:
        left = await count(
            cloud,
            "SELECT count(*) FROM migrations WHERE migration_type = 'evacuation'"
            " AND status <> 'completed'",
        )
        return left == 0

    up = await until(heartbeating, f"{SOURCE} reporting again", args.timeout)
    await until(all_completed, "every evacuation completed", args.timeout)
    total = time.monotonic() - started
    return total, total - up


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shape = CloudShape(
        hosts=args.hosts,
        vcpus=max(64, args.instances),
        memory_mb=max(256 * 1024, args.instances * 1024),
        local_gb=max(4096, args.instances * 2),
        report_interval=1.0,
        extra_env=(("KEEL_COMPUTE__RECONCILE_INTERVAL", "1"),),
    )
    async with bench_cloud(shape) as cloud:
        cloud.start_fleet()
        cloud.start_agent(SOURCE)
        await cloud.wait_hosts_up(args.hosts + 1, args.timeout)
        headers = {"X-Auth-Token": cloud.token}
        async with httpx.AsyncClient(
            base_url=cloud.api_url + "/v2.1/", headers=headers, timeout=60
        ) as http:
            unlimited = {"quota_set": {"instances": -1, "cores": -1, "ram": -1}}
            (await http.put("os-quota-sets/bench-project", json=unlimited)).raise_for_status()
            await fill_source(http, cloud, args)
            await lose_source(http, cloud)
            sent, moved = await evacuate_all(http, cloud, args)
        confirmed, confirmed_after_up = await confirm_all(cloud, args)
        async with cloud.pool.acquire() as conn:
            check = await check_capacity(conn)
            on_source = await conn.fetchval(
                "SELECT memory_mb_used FROM compute_nodes WHERE host = $1", SOURCE
            )
    report(
        "evacuate",
        {
            "instances": args.instances,
            "hosts": args.hosts,
            "requests_s": sent,
            "all_active_s": moved,
            "per_s": args.instances / moved if moved else float("nan"),
            "confirm_s": confirmed,
            "confirm_after_up_s": confirmed_after_up,
            "source_memory_mb_used": on_source,
        },
    )
    report("capacity check", check.figures())
    if args.instances >= 500:
        target("evacuate 500: all ACTIVE", moved, at_most=60, unit=" s")
        target("evacuate 500: source confirms (from its start)", confirmed, at_most=10, unit=" s")
    return 0 if check.passed and on_source == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
