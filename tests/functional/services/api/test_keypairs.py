"""Key pairs through the API: import, generation, validation, quota, per-user ownership."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.functional.services.api.conftest import ADMIN, MEMBER, OTHER_MEMBER, at

pytestmark = pytest.mark.functional

PUBLIC_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKyZymnQuOY/S4Sk68YlgH3Oxzf2Bp+IACeozsJtZbBO "
    "someone@example"
)
#: What ``ssh-keygen -l -E md5`` prints for PUBLIC_KEY.
FINGERPRINT = "27:9e:81:f7:0c:3e:4b:fa:d2:f6:36:a6:18:9d:c4:f8"


async def create(
    client: httpx.AsyncClient,
    name: str,
    *,
    headers: dict[str, str] = MEMBER,
    version: str = "2.10",
    **fields: object,
) -> httpx.Response:
    return await client.post(
        "/v2.1/os-keypairs",
        headers=at(version, headers),
        json={"keypair": {"name": name, **fields}},
    )


async def test_import_then_list_show_delete(client: httpx.AsyncClient) -> None:
    created = await create(client, "laptop", public_key=PUBLIC_KEY + "\n")
    assert created.status_code == 201, created.text
    body = created.json()["keypair"]
    assert body["fingerprint"] == FINGERPRINT
    assert body["type"] == "ssh"
    assert body["user_id"] == "alice"
    assert "private_key" not in body

    admins_own = await client.get("/v2.1/os-keypairs", headers=at("2.10", ADMIN))
    assert admins_own.json()["keypairs"] == []
    mine = await client.get("/v2.1/os-keypairs", headers=at("2.10", MEMBER))
    assert [k["keypair"]["name"] for k in mine.json()["keypairs"]] == ["laptop"]
    theirs = await client.get("/v2.1/os-keypairs", headers=at("2.10", OTHER_MEMBER))
    assert theirs.json()["keypairs"] == []

    shown = await client.get("/v2.1/os-keypairs/laptop", headers=at("2.10", MEMBER))
    assert shown.json()["keypair"]["public_key"] == PUBLIC_KEY
    assert shown.json()["keypair"]["deleted"] is False
    assert (
        await client.get("/v2.1/os-keypairs/laptop", headers=at("2.10", OTHER_MEMBER))
    ).status_code == 404

    deleted = await client.delete("/v2.1/os-keypairs/laptop", headers=at("2.10", MEMBER))
    assert deleted.status_code == 204
    gone = await client.delete("/v2.1/os-keypairs/laptop", headers=at("2.10", MEMBER))
    assert gone.status_code == 404


async def test_microversion_2_1_answers_200_and_202_without_type(client: httpx.AsyncClient) -> None:
    created = await create(client, "old", version="2.1", public_key=PUBLIC_KEY)
    assert created.status_code == 200
    assert "type" not in created.json()["keypair"]
    refused = await create(client, "typed", version="2.1", public_key=PUBLIC_KEY, type="ssh")
    assert refused.status_code == 400
    deleted = await client.delete("/v2.1/os-keypairs/old", headers=at("2.1", MEMBER))
    assert deleted.status_code == 202


async def test_generated_ssh_and_x509_keys_come_with_their_private_key(
    client: httpx.AsyncClient,
) -> None:
    ssh = (await create(client, "made-ssh")).json()["keypair"]
    private = serialization.load_pem_private_key(ssh["private_key"].encode(), None)
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert ssh["public_key"].startswith(public.decode())
    shown = await client.get("/v2.1/os-keypairs/made-ssh", headers=at("2.10", MEMBER))
    assert "private_key" not in shown.json()["keypair"]

    cert = (await create(client, "made-x509", type="x509")).json()["keypair"]
    assert cert["type"] == "x509"
    loaded = x509.load_pem_x509_certificate(cert["public_key"].encode())
    assert loaded.subject.rfc4514_string() == "CN=alice"
    assert "PRIVATE KEY" in cert["private_key"]


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"public_key": "ssh-rsa not-base64!"}, "bad key"),
        ({"public_key": "hello"}, "not a key"),
        ({"public_key": PUBLIC_KEY, "type": "x509"}, "ssh key as a certificate"),
        ({"type": "pgp"}, "unknown type"),
        ({"public_key": PUBLIC_KEY, "colour": "red"}, "unknown field"),
    ],
)
async def test_bad_key_pairs_are_400(
    client: httpx.AsyncClient, fields: dict[str, Any], why: str
) -> None:
    response = await create(client, "k", **fields)
    assert response.status_code == 400, why
    assert response.json()["badRequest"]["message"]


@pytest.mark.parametrize("name", ["", " lead", "trail ", "a/b", "dot.ted", "x" * 256])
async def test_bad_names_are_400(client: httpx.AsyncClient, name: str) -> None:
    assert (await create(client, name, public_key=PUBLIC_KEY)).status_code == 400


async def test_from_2_92_names_may_hold_at_and_dot_and_keys_are_imported_only(
    client: httpx.AsyncClient,
) -> None:
    name = "me@desk.example"
    assert (await create(client, name, version="2.91", public_key=PUBLIC_KEY)).status_code == 400
    made = await create(client, name, version="2.92", public_key=PUBLIC_KEY)
    assert made.status_code == 201, made.text
    assert made.json()["keypair"]["name"] == name
    assert "private_key" not in made.json()["keypair"]
    generated = await create(client, "gen", version="2.92")
    assert generated.status_code == 400
    assert "'public_key' is a required property" in generated.json()["badRequest"]["message"]
    assert (await create(client, "gen", version="2.91")).status_code == 201
    for bad in ("a/b", "x" * 256, " lead"):
        assert (await create(client, bad, version="2.92", public_key=PUBLIC_KEY)).status_code == 400


async def test_duplicate_name_is_409_per_user(client: httpx.AsyncClient) -> None:
    assert (await create(client, "dup", public_key=PUBLIC_KEY)).status_code == 201
    again = await create(client, "dup", public_key=PUBLIC_KEY)
    assert again.status_code == 409
    assert "already exists" in again.json()["conflictingRequest"]["message"]
    other = await create(client, "dup", headers=OTHER_MEMBER, public_key=PUBLIC_KEY)
    assert other.status_code == 201


async def test_more_than_the_quota_is_403_even_concurrently(client: httpx.AsyncClient) -> None:
    quota = await client.put(
        "/v2.1/os-quota-sets/team", headers=ADMIN, json={"quota_set": {"key_pairs": 3}}
    )
    assert quota.status_code == 200, quota.text
    answers = await asyncio.gather(
        *(create(client, f"k{i}", public_key=PUBLIC_KEY) for i in range(6))
    )
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * 3 + [403] * 3
    refused = next(a for a in answers if a.status_code == 403)
    assert refused.json()["forbidden"]["message"] == "Maximum number of key pairs exceeded"


async def test_admins_manage_other_users_key_pairs_from_2_10(client: httpx.AsyncClient) -> None:
    made = await create(client, "theirs", headers=ADMIN, public_key=PUBLIC_KEY, user_id="bob")
    assert made.status_code == 201
    assert made.json()["keypair"]["user_id"] == "bob"
    bobs = await client.get("/v2.1/os-keypairs", headers=at("2.10", OTHER_MEMBER))
    assert [k["keypair"]["name"] for k in bobs.json()["keypairs"]] == ["theirs"]
    listed = await client.get("/v2.1/os-keypairs?user_id=bob", headers=at("2.10", ADMIN))
    assert [k["keypair"]["name"] for k in listed.json()["keypairs"]] == ["theirs"]
    shown = await client.get("/v2.1/os-keypairs/theirs?user_id=bob", headers=at("2.10", ADMIN))
    assert shown.status_code == 200
    member = await create(client, "x", headers=MEMBER, public_key=PUBLIC_KEY, user_id="bob")
    assert member.status_code == 403
    early = await create(client, "y", headers=ADMIN, version="2.9", user_id="bob")
    assert early.status_code == 400


async def test_list_pages_from_2_35(client: httpx.AsyncClient) -> None:
    for name in ("a", "b", "c"):
        assert (await create(client, name, public_key=PUBLIC_KEY)).status_code == 201
    first = await client.get("/v2.1/os-keypairs?limit=2", headers=at("2.35", MEMBER))
    assert [k["keypair"]["name"] for k in first.json()["keypairs"]] == ["a", "b"]
    href = first.json()["keypairs_links"][0]["href"]
    assert "marker=b" in href
    rest = await client.get("/v2.1/os-keypairs?marker=b", headers=at("2.35", MEMBER))
    assert [k["keypair"]["name"] for k in rest.json()["keypairs"]] == ["c"]
    unknown = await client.get("/v2.1/os-keypairs?marker=zz", headers=at("2.35", MEMBER))
    assert unknown.status_code == 400


@pytest.mark.parametrize("user_id", ["", "u" * 65, "ü" * 40])
async def test_an_admin_generates_an_x509_pair_for_any_user_id(
    client: httpx.AsyncClient, user_id: str
) -> None:
    made = await create(client, "cert", headers=ADMIN, type="x509", user_id=user_id)
    assert made.status_code == 201, made.text
    assert "BEGIN CERTIFICATE" in made.json()["keypair"]["public_key"]
