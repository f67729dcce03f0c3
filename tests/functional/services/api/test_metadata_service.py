"""The metadata service (keel-api's second listener) against PostgreSQL."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from services.api.metadata.app import create_metadata_app
from shared.config import MetadataSettings
from shared.guest_metadata import signature
from tests.functional.services.api.conftest import MEMBER, Recorder, add_image, at
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

SECRET = "metadata-secret-0123456789"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOh5qvBHxVgNrkTq6DnSmJNm5GsmPDjQgGZ2mT3TKDh8 me@desk"
SCRIPT = b"#!/bin/sh\necho hello\n"


@pytest.fixture
async def metadata(db_pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    app = create_metadata_app(MetadataSettings(bind="127.0.0.1:8775", secret=SECRET), db_pool)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://169.254.169.254"
    ) as http:
        yield http


def signed(instance_id: str) -> dict[str, str]:
    return {"X-Instance-ID": instance_id, "X-Instance-ID-Signature": signature(SECRET, instance_id)}


async def new_server(client: httpx.AsyncClient, name: str, **fields: object) -> str:
    response = await client.post(
        "/v2.1/servers", headers=at("2.73", MEMBER), json=server_body(name, **fields)
    )
    assert response.status_code == 202, response.text
    server_id: str = response.json()["server"]["id"]
    return server_id


async def test_a_signed_request_reads_the_servers_openstack_and_ec2_data(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    metadata: httpx.AsyncClient,
) -> None:
    await add_image(db_pool)
    made = await client.post(
        "/v2.1/os-keypairs", headers=MEMBER, json={"keypair": {"name": "k", "public_key": KEY}}
    )
    assert made.status_code == 200, made.text
    server_id = await new_server(
        client,
        "Web_1",
        key_name="k",
        metadata={"role": "web"},
        user_data=base64.b64encode(SCRIPT).decode(),
    )
    mine = signed(server_id)

    versions = await metadata.get("/openstack", headers=mine)
    files = await metadata.get("/openstack/latest", headers=mine)
    meta = (await metadata.get("/openstack/latest/meta_data.json", headers=mine)).json()
    user_data = await metadata.get("/openstack/2012-08-10/user_data", headers=mine)
    network = (await metadata.get("/openstack/latest/network_data.json", headers=mine)).json()
    keys = await metadata.get("/latest/meta-data/public-keys/", headers=mine)
    key = await metadata.get("/latest/meta-data/public-keys/0/openssh-key", headers=mine)
    ipv4 = await metadata.get("/2009-04-04/meta-data/local-ipv4", headers=mine)
    ec2_user_data = await metadata.get("/latest/user-data", headers=mine)

    assert "2012-08-10" in versions.text.split("\n")
    assert versions.text.split("\n")[-1] == "latest"
    assert set(files.text.split("\n")) >= {"meta_data.json", "network_data.json", "user_data"}
    assert meta["uuid"] == server_id
    assert meta["name"] == "Web_1"
    assert meta["hostname"] == "web-1"
    assert meta["public_keys"] == {"k": KEY}
    assert meta["meta"] == {"role": "web"}
    assert user_data.content == ec2_user_data.content == SCRIPT
    [net] = network["networks"]
    assert net["ip_address"] == ipv4.text == "10.0.0.2"
    assert net["netmask"] == "255.255.255.0"
    assert net["routes"][0]["gateway"] == "10.0.0.1"
    assert keys.text == "0=k"
    assert key.text == KEY


async def test_unsigned_badly_signed_and_unknown_requests_learn_nothing(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    metadata: httpx.AsyncClient,
) -> None:
    await add_image(db_pool)
    server_id = await new_server(client, "secret-holder", metadata={"secret": "s3cr3t"})
    path = "/openstack/latest/meta_data.json"

    unsigned = await metadata.get(path, headers={"X-Instance-ID": server_id})
    forged = await metadata.get(
        path, headers={"X-Instance-ID": server_id, "X-Instance-ID-Signature": "0" * 64}
    )
    other_secret = await metadata.get(
        path,
        headers={
            "X-Instance-ID": server_id,
            "X-Instance-ID-Signature": signature("another-secret-0123456789", server_id),
        },
    )
    unknown = await metadata.get(path, headers=signed("6f9619ff-8b86-4d11-b42d-00c04fc964ff"))
    await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)
    deleted = await metadata.get(path, headers=signed(server_id))

    assert unsigned.status_code == 400
    assert forged.status_code == other_secret.status_code == 403
    assert unknown.status_code == deleted.status_code == 404
    for answer in (unsigned, forged, other_secret, unknown, deleted):
        assert "s3cr3t" not in answer.text
        with pytest.raises(json.JSONDecodeError):
            json.loads(answer.text)


async def test_network_data_lists_every_address_in_the_order_asked(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    metadata: httpx.AsyncClient,
) -> None:
    await add_image(db_pool)
    networks = []
    for name, cidr in (("left", "10.120.0.0/24"), ("right", "10.121.0.0/24")):
        made = await client.post(
            "/network/v2.0/networks", headers=MEMBER, json={"network": {"name": name}}
        )
        subnet = {"subnet": {"network_id": made.json()["network"]["id"], "cidr": cidr}}
        assert (await client.post("/network/v2.0/subnets", headers=MEMBER, json=subnet)).is_success
        networks.append(made.json()["network"]["id"])
    server_id = await new_server(
        client, "multi", networks=[{"uuid": networks[1]}, {"uuid": networks[0]}]
    )
    data = (
        await metadata.get("/openstack/latest/network_data.json", headers=signed(server_id))
    ).json()
    shown = await client.get(f"/v2.1/servers/{server_id}/ips", headers=MEMBER)
    right, left = shown.json()["addresses"]["right"][0], shown.json()["addresses"]["left"][0]
    assert [n["ip_address"] for n in data["networks"]] == [right["addr"], left["addr"]]
    assert [n["network_id"] for n in data["networks"]] == [networks[1], networks[0]]
    assert [n["netmask"] for n in data["networks"]] == ["255.255.255.0"] * 2
    assert len({link["ethernet_mac_address"] for link in data["links"]}) == 2
