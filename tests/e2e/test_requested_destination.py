"""A requested destination on create, with real agents and the real CLI at 2.74.

Three hosts: ``rd-a`` and ``rd-b`` in zone ``nova``, ``rd-c`` in zone ``z2`` with the
hypervisor host name ``node-c``. ``rd-b`` has the least RAM, and the scheduler always
tries its best-ranked host first (subset size 1), so a server lands on ``rd-b`` only
when it is asked to.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.db import allocations
from tests.e2e.cloud import CIRROS_ID, Cloud, CloudConfig
from tests.e2e.moves import service_set
from tests.e2e.test_crash_recovery import replace, up
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOSTS = ("rd-a", "rd-b", "rd-c")
SETTLE = 60.0
V274 = ("--os-compute-api-version", "2.74")


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(
        computes=HOSTS,
        env=(
            ("KEEL_SCHEDULER__HOST_SUBSET_SIZE", "1"),
            ("KEEL_COMPUTE__RECONCILE_INTERVAL", "1"),
        ),
    )


@pytest.fixture(scope="module")
async def shaped(cloud: Cloud) -> Cloud:
    """rd-b with the least RAM (4 GB, ranked last) and room for many small servers; rd-c
    in zone z2 as node-c."""
    replace(
        cloud,
        "rd-b",
        "keel-compute",
        "rd-b",
        KEEL_COMPUTE__MEMORY_MB="4096",
        KEEL_COMPUTE__VCPUS="16",
    )
    replace(
        cloud,
        "rd-c",
        "keel-compute",
        "rd-c",
        KEEL_COMPUTE__AVAILABILITY_ZONE="z2",
        KEEL_COMPUTE__HYPERVISOR_HOSTNAME="node-c",
    )

    async def reported() -> bool:
        async with cloud.pool.acquire() as conn:
            rows = await conn.fetch(
                """SELECT host, memory_mb, availability_zone, hypervisor_hostname
                     FROM compute_nodes WHERE deleted_at IS NULL"""
            )
        seen = {
            r["host"]: (r["memory_mb"], r["availability_zone"], r["hypervisor_hostname"])
            for r in rows
        }
        return seen.get("rd-b", (0,))[0] == 4096 and seen.get("rd-c", ("", "", ""))[2] == "node-c"

    await wait_until(reported, what="rd-b and rd-c reporting their new shape", timeout=SETTLE)
    for host in HOSTS:
        await up(cloud, "keel-compute", host)
    return cloud


@pytest.fixture
async def clean(shaped: Cloud) -> AsyncIterator[None]:
    """Every server deleted and every host enabled and up after the test."""
    yield
    for host in HOSTS:
        if shaped.processes[host].popen.poll() is not None:
            shaped.start(host, "keel-compute", host)
        shaped.openstack_raw(
            "compute", "service", "set", "--up", "--enable", host, "keel-compute", as_json=False
        )
    for server in shaped.openstack("server", "list", "--all-projects"):
        await shaped.delete_server(server["ID"])
    for host in HOSTS:
        await shaped.wait_for_service(host, up=True)


async def create(cloud: Cloud, name: str, *args: str, flavor: str = "m1.tiny") -> dict[str, Any]:
    """``openstack server create`` at 2.74, then (polling the API) the server once it
    settles in ACTIVE or ERROR."""
    created = await asyncio.to_thread(
        cloud.openstack,
        *V274, "server", "create", "--flavor", flavor, "--image", str(CIRROS_ID), *args, name,
    )  # fmt: skip
    server_id = created["id"]
    shown: dict[str, Any] = {}

    async def settled() -> bool:
        nonlocal shown
        shown = (await cloud.get(f"servers/{server_id}", version="2.74"))["server"]
        return shown["status"] in ("ACTIVE", "ERROR")

    await wait_until(settled, what=f"server {name} settling", timeout=SETTLE)
    return shown


def refused(cloud: Cloud, name: str, *args: str, cloud_name: str = "keel") -> str:
    """The CLI's error for a create that must be refused (nothing is created)."""
    result = cloud.openstack_raw(
        *V274, "server", "create", "--flavor", "m1.tiny", "--image", str(CIRROS_ID),
        *args, name, cloud=cloud_name, as_json=False,
    )  # fmt: skip
    assert result.returncode != 0, result.stdout
    return result.stderr


async def rows_named(cloud: Cloud, name: str) -> int:
    async with cloud.pool.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM instances WHERE display_name = $1", name
        )
    return count


async def check_claims(cloud: Cloud) -> None:
    async with cloud.pool.acquire() as conn:
        assert await allocations.usage_drift(conn) == []
        over = await conn.fetch("SELECT host FROM compute_nodes WHERE memory_mb_used > memory_mb")
    assert over == []


async def test_a_requested_host_or_node_is_where_the_server_lands(
    cloud: Cloud, clean: None
) -> None:
    unasked = await create(cloud, "rd-free")
    assert unasked["OS-EXT-SRV-ATTR:host"] != "rd-b"
    on_b = await asyncio.gather(
        *(create(cloud, f"rd-host-{i}", "--host", "rd-b") for i in range(5))
    )
    assert [(s["status"], s["OS-EXT-SRV-ATTR:host"]) for s in on_b] == [("ACTIVE", "rd-b")] * 5
    by_node = await create(cloud, "rd-node", "--hypervisor-hostname", "node-c")
    assert (by_node["status"], by_node["OS-EXT-SRV-ATTR:host"]) == ("ACTIVE", "rd-c")
    assert by_node["OS-EXT-SRV-ATTR:hypervisor_hostname"] == "node-c"
    both = await create(cloud, "rd-both", "--host", "rd-c", "--hypervisor-hostname", "node-c")
    assert (both["status"], both["OS-EXT-SRV-ATTR:host"]) == ("ACTIVE", "rd-c")
    await check_claims(cloud)


async def test_bad_destinations_are_refused_and_nothing_is_created(
    cloud: Cloud, clean: None
) -> None:
    cases = [
        (("--host", "nowhere"), "Compute host nowhere could not be found."),
        (("--hypervisor-hostname", "nowhere"), "hypervisor hostname nowhere could not be found"),
        (
            ("--host", "rd-a", "--hypervisor-hostname", "node-c"),
            "Compute host rd-a with hypervisor hostname node-c could not be found.",
        ),
        (("--host", "rd-b", "--availability-zone", "nova:rd-b"), "mutually exclusive"),
    ]
    for i, (args, message) in enumerate(cases):
        error = refused(cloud, f"rd-bad-{i}", *args)
        assert "400" in error, error
        assert message in error, error
        assert await rows_named(cloud, f"rd-bad-{i}") == 0

    denied = refused(cloud, "rd-member", "--host", "rd-b", cloud_name="keel-member")
    assert "403" in denied, denied
    assert "Policy doesn't allow" in denied
    body = {
        "server": {"name": "rd-old", "flavorRef": "1", "imageRef": str(CIRROS_ID), "host": "rd-b"}
    }
    async with cloud.http(cloud.member_token) as http:
        old = await http.post(
            "servers", json=body, headers={"OpenStack-API-Version": "compute 2.73"}
        )
    assert old.status_code == 400, old.text
    assert "'host' unexpected" in old.json()["badRequest"]["message"]
    assert await rows_named(cloud, "rd-member") + await rows_named(cloud, "rd-old") == 0


async def test_disabled_or_full_requested_host_is_no_valid_host_unless_forced(
    cloud: Cloud, clean: None
) -> None:
    service_set(cloud, "rd-b", "--disable")
    failed = await create(cloud, "rd-disabled", "--host", "rd-b")
    assert failed["status"] == "ERROR"
    assert "No valid host" in failed["fault"]["message"]
    forced = await create(cloud, "rd-forced", "--availability-zone", "nova:rd-b")
    assert (forced["status"], forced["OS-EXT-SRV-ATTR:host"]) == ("ACTIVE", "rd-b")
    service_set(cloud, "rd-b", "--enable")
    await cloud.delete_server(forced["id"])

    filler = await create(cloud, "rd-filler", "--host", "rd-b", flavor="m1.medium")
    assert (filler["status"], filler["OS-EXT-SRV-ATTR:host"]) == ("ACTIVE", "rd-b")
    full = await create(cloud, "rd-full", "--host", "rd-b")
    assert full["status"] == "ERROR"
    assert "No valid host" in full["fault"]["message"]
    forced_full = await create(cloud, "rd-forced-full", "--availability-zone", "nova:rd-b")
    assert forced_full["status"] == "ERROR"
    assert "No valid host" in forced_full["fault"]["message"]
    await check_claims(cloud)


async def test_the_destination_does_not_stick_to_later_moves(cloud: Cloud, clean: None) -> None:
    migrated = await create(cloud, "rd-migrate", "--host", "rd-a")
    assert migrated["OS-EXT-SRV-ATTR:host"] == "rd-a"
    cloud.openstack(
        "--os-compute-api-version", "2.56", "server", "migrate", migrated["id"], as_json=False
    )

    async def verifying() -> bool:
        shown = (await cloud.get(f"servers/{migrated['id']}"))["server"]
        return bool(shown["status"] == "VERIFY_RESIZE")

    await wait_until(verifying, what="the migration reaching VERIFY_RESIZE", timeout=SETTLE)
    cloud.openstack("server", "resize", "confirm", migrated["id"], as_json=False)
    moved = cloud.openstack("server", "show", migrated["id"])
    assert moved["OS-EXT-SRV-ATTR:host"] in ("rd-b", "rd-c")

    evacuated = await create(cloud, "rd-evacuate", "--host", "rd-a")
    assert evacuated["OS-EXT-SRV-ATTR:host"] == "rd-a"
    assert cloud.processes["rd-a"].stop() == 0
    service_set(cloud, "rd-a", "--down")
    cloud.openstack(
        "--os-compute-api-version", "2.29", "server", "evacuate", evacuated["id"], as_json=False
    )

    async def rebuilt() -> bool:
        shown = (await cloud.get(f"servers/{evacuated['id']}"))["server"]
        return bool(shown["status"] == "ACTIVE" and shown["OS-EXT-SRV-ATTR:host"] != "rd-a")

    await wait_until(rebuilt, what="the evacuation rebuilding elsewhere", timeout=SETTLE)
    # rd-a comes back and confirms the evacuation before it may be forced up again.
    cloud.start("rd-a", "keel-compute", "rd-a")

    async def completed() -> bool:
        found = await cloud.get(f"os-migrations?instance_uuid={evacuated['id']}", version="2.59")
        return bool(found["migrations"][0]["status"] == "completed")

    await wait_until(completed, what="rd-a confirming the evacuation", timeout=SETTLE)
    await check_claims(cloud)


async def test_availability_zones(cloud: Cloud, clean: None) -> None:
    in_z2 = await asyncio.gather(
        *(create(cloud, f"rd-z2-{i}", "--availability-zone", "z2") for i in range(3))
    )
    assert [(s["status"], s["OS-EXT-SRV-ATTR:host"]) for s in in_z2] == [("ACTIVE", "rd-c")] * 3
    assert {s["OS-EXT-AZ:availability_zone"] for s in in_z2} == {"z2"}
    zones = cloud.openstack("availability", "zone", "list", "--compute")
    assert {z["Zone Name"] for z in zones} >= {"nova", "z2"}
    member = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", str(CIRROS_ID),
        "--availability-zone", "nova", "rd-member-zone", cloud="keel-member",
    )  # fmt: skip
    assert member["OS-EXT-AZ:availability_zone"] == "nova"
