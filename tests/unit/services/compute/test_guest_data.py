"""What a guest is told at first boot reaches the agent (compute 1.11; its host name
1.12), and older agents are sent the older message; the config drive's files are made
from it."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

from services.compute.rpcapi import ComputeAPI, InstanceSpec
from services.compute.virt.libvirt.config_drive import guest_info
from services.compute.virt.local import LocalDriver
from shared.context import RequestContext
from shared.guest_metadata import config_drive_files, hostname
from shared.objects.network import FixedIp, mac_address
from tests.unit.services.compute.standin import eventually, make_spec
from tests.unit.services.compute.test_manager import _rig

NETWORK = uuid.UUID("5d0c1a44-2f0e-4f6b-9a51-6b65656c0001")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOh5qvBHxVgNrkTq6DnSmJNm5GsmPDjQgGZ2mT3TKDh8 me@desk"


def told(name: str = "Web_01.example", hostname: str | None = None) -> InstanceSpec:
    address = FixedIp(
        network_id=NETWORK,
        network_name="private",
        address="10.0.3.7",
        mac=mac_address(NETWORK, "10.0.3.7"),
        cidr="10.0.0.0/16",
    )
    return make_spec().model_copy(
        update={
            "display_name": name,
            "addresses": [address],
            "key_name": "k",
            "key_data": KEY,
            "config_drive": True,
            "project_id": "team",
            "user_data": base64.b64encode(b"#!/bin/sh\necho hi\n").decode(),
            "hostname": hostname,
        }
    )


async def _built_as(tmp_path: Path, cap: str | None) -> dict[str, object]:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        compute = rig.compute
        if cap is not None:
            compute = ComputeAPI(rig.compute.client.transport, version_cap=cap)
        spec = told(hostname="web-01.example.org")
        await compute.build_and_run_instance(RequestContext(), rig.service_uuid, spec)
        await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
        written: dict[str, object] = json.loads((rig.guest_dir(spec) / "metadata.json").read_text())
    return written


async def test_an_agent_of_1_10_is_told_the_key_the_drive_and_the_networks_range(
    tmp_path: Path,
) -> None:
    written = await _built_as(tmp_path, None)

    assert written["key_data"] == KEY
    assert written["config_drive"] is True
    assert written["project_id"] == "team"
    assert written["addresses"][0]["cidr"] == "10.0.0.0/16"  # type: ignore[index]
    assert written["hostname"] == "web-01.example.org"


async def test_an_agent_of_1_11_is_told_all_but_the_host_name(tmp_path: Path) -> None:
    written = await _built_as(tmp_path, "1.11")

    assert written["key_data"] == KEY
    assert written["config_drive"] is True
    assert written["hostname"] is None


async def test_an_older_agent_is_sent_the_build_without_them(tmp_path: Path) -> None:
    written = await _built_as(tmp_path, "1.9")

    assert written["key_data"] is None
    assert written["config_drive"] is False
    assert written["project_id"] == ""
    assert written["hostname"] is None
    assert written["addresses"][0]["cidr"] is None  # type: ignore[index]
    assert written["addresses"][0]["address"] == "10.0.3.7"  # type: ignore[index]


def test_the_config_drive_has_openstacks_layout_and_the_ec2_part() -> None:
    spec = told()

    files = config_drive_files(guest_info(spec))
    meta = json.loads(files["openstack/latest/meta_data.json"])
    network = json.loads(files["openstack/latest/network_data.json"])
    ec2 = json.loads(files["ec2/latest/meta-data.json"])

    assert meta["uuid"] == str(spec.uuid)
    assert meta["hostname"] == "web-01.example"
    assert meta["public_keys"] == {"k": KEY}
    assert files["openstack/latest/user_data"] == b"#!/bin/sh\necho hi\n"
    assert files["ec2/2009-04-04/user-data"] == b"#!/bin/sh\necho hi\n"
    assert "openstack/2012-08-10/meta_data.json" in files
    assert "openstack/2012-08-10/network_data.json" not in files  # from 2015-10-15 on
    [net] = network["networks"]
    assert (net["ip_address"], net["netmask"]) == ("10.0.3.7", "255.255.0.0")
    assert net["routes"] == [{"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": "10.0.0.1"}]
    assert network["links"][0]["ethernet_mac_address"] == spec.addresses[0].mac
    assert ec2["local-ipv4"] == "10.0.3.7"
    assert ec2["public-keys"] == {"0": {"openssh-key": KEY}}


def test_the_config_drive_tells_the_kept_host_name_or_one_made_from_the_name() -> None:
    kept = config_drive_files(guest_info(told(hostname="web-01.example.org")))
    assert json.loads(kept["openstack/latest/meta_data.json"])["hostname"] == "web-01.example.org"
    made = config_drive_files(guest_info(told()))
    assert json.loads(made["openstack/latest/meta_data.json"])["hostname"] == "web-01.example"


def test_host_names_are_made_as_nova_makes_them() -> None:
    instance = uuid.UUID("6f9619ff-8b86-4d11-b42d-00c04fc964ff")

    assert hostname("My Server_1", instance) == "my-server-1"
    assert hostname("-déjà.vu-", instance) == "dj.vu"
    assert hostname("x" * 80, instance) == "x" * 63
    assert hostname("!!!", instance) == f"server-{instance}"
