"""``bench/boot.py --driver libvirt``: real guests, timed until their console says so.

A bench cloud (its own database and exchange) with ``--hosts`` keel-compute agents on
the libvirt driver, all on this machine's libvirtd (each its own node identity and
hypervisor name). The test guest (``make image``) is uploaded through the image API like
an operator would; ``--clients`` clients each create a server with a 128 MiB flavor and
wait until its console log shows ``keel-guest-up <its uuid>``, then the next, until
``--servers`` were booted. Latency is from the start of the POST to the moment the
marker is seen (the console file is read every 100 ms on this machine). Figures: servers
per second to the console marker, its p50/p99, and CPU per boot of the agents, of the
QEMU processes (libvirtd's children) and of the whole machine. Every server is deleted
afterwards, and any domain the agents left is destroyed.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx

from benchkit import LoadResult, figures, report, run_load
from benchkit.cloud import Cloud, CloudShape, bench_cloud, machine_cpu_seconds
from shared.exceptions import BuildFailed

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / ".keel" / "images"
SECRET = "bench-libvirt-url-secret-0123456789"
FLAVOR_ID = "bench-guest"
POLL = 0.1


def qemu_cpu_seconds() -> float:
    """CPU seconds used so far by every QEMU process on the machine (the guests)."""
    total = 0.0
    tick = 100.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        if name.startswith("qemu-system"):
            fields = text[text.rfind(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def upload(http: httpx.AsyncClient, name: str, path: Path, **fields: Any) -> str:
    made = await http.post("/image/v2/images", json={"name": name, **fields})
    made.raise_for_status()
    image_id: str = made.json()["id"]
    put = await http.put(
        f"/image/v2/images/{image_id}/file",
        content=await asyncio.to_thread(path.read_bytes),
        headers={"Content-Type": "application/octet-stream"},
    )
    put.raise_for_status()
    return image_id


async def prepare(cloud: Cloud) -> str:
    """The guest's images and flavor; the bootable image's id."""
    async with httpx.AsyncClient(
        base_url=cloud.api_url, headers={"X-Auth-Token": cloud.token}, timeout=60
    ) as http:
        kernel = await upload(http, "keel-test-kernel", IMAGES / "keel-test-kernel")
        ramdisk = await upload(http, "keel-test-ramdisk", IMAGES / "keel-test-ramdisk")
        image = await upload(
            http, "keel-test", IMAGES / "keel-test.qcow2", disk_format="qcow2",
            kernel_id=kernel, ramdisk_id=ramdisk,
        )  # fmt: skip
        flavor = {"flavor": {"name": FLAVOR_ID, "id": FLAVOR_ID, "ram": 128, "vcpus": 1,
                             "disk": 1}}  # fmt: skip
        (await http.post("/v2.1/flavors", json=flavor)).raise_for_status()
        unlimited = {"quota_set": {"instances": -1, "cores": -1, "ram": -1}}
        (await http.put("/v2.1/os-quota-sets/bench-project", json=unlimited)).raise_for_status()
    return image


def console_of(cloud: Cloud, hosts: list[str], server: UUID) -> str:
    for host in hosts:
        log = cloud.workdir / "state" / host / "instances" / str(server) / "console.log"
        try:
            return log.read_text(errors="replace")
        except OSError:
            continue
    return ""


async def boot_all(
    cloud: Cloud, http: httpx.AsyncClient, image: str, hosts: list[str], args: argparse.Namespace
) -> tuple[LoadResult, list[UUID]]:
    booted: list[UUID] = []

    async def boot(index: int) -> None:
        body = {"server": {"name": f"vm-{index}", "flavorRef": FLAVOR_ID, "imageRef": image}}
        response = await http.post("servers", json=body)
        if response.status_code != 202:
            raise BuildFailed(f"POST /servers answered {response.status_code}: {response.text}")
        server = UUID(response.json()["server"]["id"])
        booted.append(server)
        marker = f"keel-guest-up {server}"
        deadline = time.monotonic() + args.timeout
        while marker not in await asyncio.to_thread(console_of, cloud, hosts, server):
            if time.monotonic() > deadline:
                raise BuildFailed(f"server {server} showed no console marker in time")
            await asyncio.sleep(POLL)

    return await run_load(boot, args.servers, args.clients), booted


async def delete_all(http: httpx.AsyncClient, servers: list[UUID]) -> None:
    for server in servers:
        await http.delete(f"servers/{server}")
    deadline = time.monotonic() + 120
    for server in servers:
        while (await http.get(f"servers/{server}")).status_code != 404:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.5)


def start_agents(cloud: Cloud, hosts: list[str]) -> None:
    for host in hosts:
        env = {
            **cloud.env(),
            "KEEL_HOST": host,
            "KEEL_STATE_DIR": str(cloud.workdir / "state" / host),
            "KEEL_COMPUTE__DRIVER": "libvirt",
            "KEEL_COMPUTE__HYPERVISOR_HOSTNAME": host,
            "KEEL_COMPUTE__VCPUS": "8",
            "KEEL_COMPUTE__MEMORY_MB": "8192",
            "KEEL_COMPUTE__LOCAL_GB": "100",
        }
        cloud.start(host, ["keel-compute"], env)


def destroy_leftovers(cloud: Cloud, hosts: list[str]) -> int:
    """Destroy any domain the bench's agents still have (a failed run); how many."""
    import libvirt  # noqa: PLC0415 - only with the libvirt driver

    nodes = []
    for host in hosts:
        identity = cloud.workdir / "state" / host / "compute_id"
        if identity.is_file():
            nodes.append(UUID(identity.read_text().strip()).hex[:8])
    conn = libvirt.open("qemu:///system")
    removed = 0
    try:
        for dom in conn.listAllDomains(0):
            if any(dom.name().startswith(f"keel-{node}-") for node in nodes):
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
                removed += 1
    finally:
        conn.close()
    return removed


async def run(args: argparse.Namespace) -> int:
    if not await asyncio.to_thread((IMAGES / "keel-test-kernel").is_file):
        print("the test guest is not built: run `make image` first")
        return 1
    hosts = [f"lv-bench-{number}" for number in range(1, args.hosts + 1)]
    with tempfile.TemporaryDirectory(prefix="keel-bench-images-") as store:
        shape = CloudShape(
            hosts=0,
            extra_env=(
                ("KEEL_IMAGES__URL_SECRET", SECRET),
                ("KEEL_IMAGES__STORE_DIR", store),
                ("KEEL_LIBVIRT__SHUTDOWN_TIMEOUT", "10"),
            ),
        )
        return await _measure(shape, hosts, args)


async def _measure(shape: CloudShape, hosts: list[str], args: argparse.Namespace) -> int:
    async with bench_cloud(shape) as cloud:
        start_agents(cloud, hosts)
        await cloud.wait_hosts_up(len(hosts), 120)
        image = await prepare(cloud)
        agents = [cloud.processes[host] for host in hosts]
        async with httpx.AsyncClient(
            base_url=cloud.api_url + "/v2.1/", headers={"X-Auth-Token": cloud.token}, timeout=60
        ) as http:
            servers: list[UUID] = []
            try:
                cpu_before = sum(a.cpu_seconds() for a in agents), qemu_cpu_seconds()
                machine_before = machine_cpu_seconds()[0]
                result, servers = await boot_all(cloud, http, image, hosts, args)
                cpu_after = sum(a.cpu_seconds() for a in agents), qemu_cpu_seconds()
                machine_after = machine_cpu_seconds()[0]
            finally:
                await delete_all(http, servers)
                left = await asyncio.to_thread(destroy_leftovers, cloud, hosts)
                if left:
                    print(f"destroyed {left} domain(s) the agents left")
    booted = max(result.succeeded, 1)
    report(
        "boot (libvirt, to the console marker)",
        {
            "hosts": args.hosts,
            **figures(result, noun="servers"),
            "agent_cpu_ms/boot": (cpu_after[0] - cpu_before[0]) * 1000 / booted,
            "qemu_cpu_ms/boot": (cpu_after[1] - cpu_before[1]) * 1000 / booted,
            "machine_cpu_ms/boot": (machine_after - machine_before) * 1000 / booted,
        },
    )
    return 0 if result.failed == 0 else 1
