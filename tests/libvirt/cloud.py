"""A whole keel cloud on the libvirt driver, for the tier's tests that use real processes.

Two agents (distinct node identities and hypervisor names) share this machine's
libvirtd; keel-api serves the metadata service; guests' addresses come from a random
/24, so their SSH forwards (127.x.y.z) are not another run's on this machine. The test
guest is uploaded with ``openstack image create --file``, as an operator would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from deploy import guestimage
from tests.e2e.cloud import Cloud, CloudConfig, running_cloud
from tests.libvirt.guests import free_port, random_network

HOSTS = ("lv-a", "lv-b")
FLAVOR = "keel.guest"
METADATA_SECRET = "libvirt-tier-metadata-0123456789"


def agent_settings(host: str, forward_ports: Mapping[str, int]) -> dict[str, str]:
    return {
        "KEEL_COMPUTE__HYPERVISOR_HOSTNAME": host,
        "KEEL_COMPUTE__RECONCILE_INTERVAL": "1",
        "KEEL_LIBVIRT__SSH_FORWARD_PORT": str(forward_ports[host]),
    }


@asynccontextmanager
async def libvirt_cloud(
    workdir: Path,
    images: Path,
    forward_ports: Mapping[str, int],
    *,
    lease: float = 20.0,
    margin: float = 2.0,
    host_settings: Mapping[str, Mapping[str, str]] | None = None,
) -> AsyncIterator[Cloud]:
    """The cloud (in ``workdir``, which must exist), its agents up, the test guest
    uploaded and the flavor ``keel.guest`` (128 MiB) made; every server is deleted at the
    end. ``lease``: each host's fence lease (short: a forced-down host's evacuation waits
    for it), with ``margin``."""
    metadata = f"127.0.0.1:{free_port()}"
    env = (
        ("KEEL_COMPUTE__DRIVER", "libvirt"),
        ("KEEL_IMAGES__URL_SECRET", "libvirt-tier-secret-0123456789"),
        ("KEEL_IMAGES__STORE_DIR", str(workdir / "image-store")),
        ("KEEL_LIBVIRT__SHUTDOWN_TIMEOUT", "15"),
        ("KEEL_NETWORK__CIDR", str(random_network())),
        ("KEEL_NETWORK__FORWARD_NAME", "forwarded"),
        ("KEEL_METADATA__BIND", metadata),
        ("KEEL_METADATA__URL", f"http://{metadata}"),
        ("KEEL_METADATA__SECRET", METADATA_SECRET),
    )
    config = CloudConfig(computes=(), env=env, self_fence_after=lease, fence_margin=margin)
    async with running_cloud(workdir, config) as running:
        for host in HOSTS:
            settings = {
                **agent_settings(host, forward_ports),
                **(host_settings or {}).get(host, {}),
            }
            running.start(host, "keel-compute", host, **settings)
        for host in HOSTS:
            await running.wait_for_service(host, up=True)
        upload_guest(running, images)
        running.openstack("flavor", "create", "--ram", "128", "--disk", "1", "--vcpus", "1", FLAVOR)
        try:
            yield running
        finally:
            for server in running.openstack("server", "list"):
                running.openstack("server", "delete", "--wait", server["ID"], as_json=False)


def upload_guest(cloud: Cloud, images: Path) -> None:
    ids = {}
    for name, file, fmt in (
        ("keel-test-kernel", guestimage.KERNEL, "aki"),
        ("keel-test-ramdisk", guestimage.RAMDISK, "ari"),
    ):
        made = cloud.openstack(
            "image", "create", "--file", str(images / file), "--disk-format", fmt,
            "--container-format", fmt, "--public", name,
        )  # fmt: skip
        ids[name] = made["id"]
    cloud.openstack(
        "image", "create", "--file", str(images / guestimage.DISK), "--disk-format", "qcow2",
        "--container-format", "bare", "--public",
        "--property", f"kernel_id={ids['keel-test-kernel']}",
        "--property", f"ramdisk_id={ids['keel-test-ramdisk']}",
        "keel-test",
    )  # fmt: skip
