"""Metadata, description, tags, user data, networks and block devices of a create request."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from services.api.http.faults import Fault
from services.api.http.microversion import APIVersion
from services.api.servers.fields import PreparedFields, ServerFields, prepare
from shared.config import NetworkSettings

NETWORK = NetworkSettings()
IMAGE = "11111111-2222-3333-4444-555555555555"
ROOT_DISK = {
    "boot_index": 0,
    "uuid": IMAGE,
    "source_type": "image",
    "destination_type": "local",
}


def prepared(version: str = "2.73", **fields: Any) -> PreparedFields:
    parsed = ServerFields.model_validate(fields)
    return prepare(parsed, IMAGE, APIVersion.parse(version), NETWORK)


def refused(version: str = "2.73", **fields: Any) -> str:
    with pytest.raises(Fault) as caught:
        prepared(version, **fields)
    assert caught.value.code == 400
    return caught.value.message


@pytest.mark.parametrize(
    "fields",
    [
        {"metadata": "x"},
        {"metadata": ["a"]},
        {"metadata": {"k": 1}},
        {"metadata": {"k": None}},
        {"metadata": {"k": ["v"]}},
        {"metadata": {"": "v"}},
        {"metadata": {"a" * 256: "v"}},
        {"metadata": {"bad/key": "v"}},
        {"metadata": {"k": "v" * 256}},
        {"description": "a" * 256},
        {"description": "line\nbreak"},
        {"tags": "web"},
        {"tags": [""]},
        {"tags": ["a,b"]},
        {"tags": ["a/b"]},
        {"tags": ["t" * 61]},
        {"tags": [f"t{i}" for i in range(51)]},
        {"user_data": "not base64!"},
        {"user_data": "YQ"},
        {"user_data": 5},
        {"user_data": "QUFB" * 16384},
        {"networks": "all"},
        {"networks": [{"uuid": str(NETWORK.network_id), "fixed_ip": "10.0.0.300"}]},
        {"networks": [{"uuid": str(NETWORK.network_id), "surprise": 1}]},
    ],
)
def test_malformed_fields_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ServerFields.model_validate(fields)


def test_what_the_clients_send_is_accepted() -> None:
    user_data = base64.b64encode(b"#!/bin/sh\necho hi\n").decode()
    fields = prepared(
        networks="auto",
        block_device_mapping_v2=[ROOT_DISK],
        metadata={"role": "web", "owner:team": "a b.c-d_e"},
        description="front end",
        tags=["web", "prod", "web"],
        user_data=user_data,
    )
    assert fields.metadata == {"role": "web", "owner:team": "a b.c-d_e"}
    assert fields.description == "front end"
    assert fields.tags == ["web", "prod"]
    assert fields.user_data == user_data
    assert len(fields.addresses) == 1
    assert fields.addresses[0].fixed_ip is None


def test_networks_none_auto_omitted_or_the_network_by_id() -> None:
    assert prepared(networks="none").addresses == []
    assert len(prepared(networks="auto").addresses) == 1
    assert len(prepared().addresses) == 1
    assert len(prepared(networks=[]).addresses) == 1
    named = prepared(networks=[{"uuid": str(NETWORK.network_id), "fixed_ip": "10.0.3.4"}])
    assert [a.fixed_ip for a in named.addresses] == ["10.0.3.4"]


def test_ports_and_malformed_networks_are_refused_as_nova_words_it() -> None:
    port = str(uuid.uuid4())
    assert refused(networks=[{"port": port}]) == f"Port {port} could not be found."
    assert refused(networks=[{"uuid": "nope"}]).startswith("Bad networks format")
    assert refused(networks=[{"fixed_ip": "10.0.0.9"}]) == "Bad network format: missing 'uuid'"


def test_each_network_entry_asks_for_one_address_in_order() -> None:
    other = uuid.uuid4()
    listed = [{"uuid": str(NETWORK.network_id)}, {"uuid": str(other)}, {"uuid": str(other)}]
    wanted = prepared(networks=listed).addresses
    assert [a.network_id for a in wanted] == [NETWORK.network_id, other, other]


def test_interface_tags_need_2_32_or_2_42() -> None:
    tagged = [{"uuid": str(NETWORK.network_id), "tag": "eth0"}]
    assert "'tag' was unexpected" in refused("2.41", networks=tagged)
    assert prepared("2.32", networks=tagged).addresses[0].tag == "eth0"
    assert prepared("2.42", networks=tagged).addresses[0].tag == "eth0"


def test_description_from_2_19_and_tags_from_2_52() -> None:
    assert "'description' was unexpected" in refused("2.18", description="x")
    assert prepared("2.19", description="x").description == "x"
    assert "'tags' was unexpected" in refused("2.51", tags=["a"])
    assert prepared("2.52", tags=["a"]).tags == ["a"]


@pytest.mark.parametrize(
    "device",
    [
        {"source_type": "volume", "destination_type": "volume", "uuid": IMAGE, "boot_index": 0},
        {"source_type": "image", "destination_type": "volume", "uuid": IMAGE, "boot_index": 0},
        {"source_type": "snapshot", "destination_type": "volume", "uuid": IMAGE},
        {"source_type": "blank", "destination_type": "local", "guest_format": "swap"},
        {**ROOT_DISK, "uuid": "22222222-2222-3333-4444-555555555555"},
        {**ROOT_DISK, "boot_index": -1},
    ],
)
def test_volumes_and_extra_disks_are_refused(device: dict[str, Any]) -> None:
    assert refused(block_device_mapping_v2=[device]).startswith("Block Device Mapping is Invalid")


def test_legacy_block_device_mappings_are_refused() -> None:
    message = refused(block_device_mapping=[{"volume_id": IMAGE, "device_name": "vda"}])
    assert message.startswith("Block Device Mapping is Invalid")


def test_admin_password_is_echoed_or_generated() -> None:
    assert prepared(adminPass="chosen").admin_pass == "chosen"
    first, second = prepared().admin_pass, prepared().admin_pass
    assert len(first) == 12
    assert first.isalnum()
    assert first != second
