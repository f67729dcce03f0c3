"""Hostile input is a 400 (or 406/413) fault, never a 500: one regression test per case.

Each of these reached PostgreSQL (or escaped the fault handling) and was answered with
a 500: integers beyond a 32-bit column, NUL characters in text, lone surrogates, a
microversion of 10,000 digits; and a 20 MB body was read whole.
"""

from __future__ import annotations

import json
from typing import Literal

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import ApiSettings, Settings
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.api.conftest import ADMIN, MEMBER, at

pytestmark = pytest.mark.functional

INT4_OVER = 2**31
JSON = {**ADMIN, "Content-Type": "application/json"}


def fault(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    (body,) = response.json().values()
    assert body["code"] == status
    message: str = body["message"]
    message.encode("utf-8")  # always encodable
    return message


def flavor(**fields: object) -> dict[str, object]:
    return {"flavor": {"name": "hostile", "ram": 64, "vcpus": 1, "disk": 1, **fields}}


async def test_flavor_integers_beyond_int4_are_400(client: httpx.AsyncClient) -> None:
    for field in ("ram", "vcpus", "disk", "swap", "OS-FLV-EXT-DATA:ephemeral"):
        too_big = await client.post(
            "/v2.1/flavors", headers=ADMIN, json=flavor(**{field: INT4_OVER})
        )
        assert f"flavor.{field}" in fault(too_big, 400)
        fitting = await client.post(
            "/v2.1/flavors", headers=ADMIN, json=flavor(name=field, **{field: INT4_OVER - 1})
        )
        assert fitting.status_code == 200, fitting.text


async def test_image_integers_beyond_int4_are_400(client: httpx.AsyncClient) -> None:
    for field in ("min_disk", "min_ram"):
        response = await client.post(
            "/image/v2/images", headers=ADMIN, json={"name": "big", field: 2**40}
        )
        assert field in fault(response, 400)


async def test_integers_beyond_64_bits_anywhere_are_400(client: httpx.AsyncClient) -> None:
    body = b'{"flavor": {"name": "n", "ram": 1' + b"0" * 5000 + b', "vcpus": 1, "disk": 1}}'
    assert "out of range" in fault(
        await client.post("/v2.1/flavors", headers=JSON, content=body), 400
    )
    ignored = b'{"server": {"name": "n", "anything": 18446744073709551616}}'
    assert "out of range" in fault(
        await client.post("/v2.1/servers", headers=JSON, content=ignored), 400
    )


async def test_numbers_no_column_holds_are_400(client: httpx.AsyncClient) -> None:
    body = b'{"flavor": {"name": "n", "ram": 1, "vcpus": 1, "disk": 1, "rxtx_factor": %s}}'
    for number in (b"NaN", b"Infinity", b"-Infinity", b"1e400"):
        fault(await client.post("/v2.1/flavors", headers=JSON, content=body % number), 400)


NUL_QUERIES = [
    ("/v2.1/servers/detail", "name", {"name": "a\x00b"}),
    ("/v2.1/servers", "project_id", {"all_tenants": "1", "project_id": "p\x00"}),
    ("/v2.1/images", "name", {"name": "\x00"}),
    ("/image/v2/images", "status", {"status": "active\x00"}),
    ("/v2.1/os-services", "host", {"host": "h\x00"}),
    ("/v2.1/os-services", "binary", {"binary": "\x00"}),
    ("/v2.1/flavors", "marker", {"marker": "\x00"}),
]
NUL_PATHS = [
    "/v2.1/flavors/a%00b",
    "/v2.1/flavors/%00/os-extra_specs",
    "/v2.1/servers/%00",
    "/v2.1/images/%00",
    "/v2.1/os-hypervisors/%00",
]


async def test_nul_in_query_and_path_parameters_is_400(client: httpx.AsyncClient) -> None:
    for path, name, params in NUL_QUERIES:
        response = await client.get(path, headers=ADMIN, params=params)
        assert f"query parameter {name}" in fault(response, 400)
    for path in NUL_PATHS:
        assert "URL path" in fault(await client.get(path, headers=at("2.73")), 400)


async def test_nul_in_names_and_image_properties_is_400(client: httpx.AsyncClient) -> None:
    named = await client.post("/v2.1/flavors", headers=ADMIN, json=flavor(name="a\x00b"))
    assert "flavor.name" in fault(named, 400)
    described = await client.post(
        "/v2.1/flavors", headers=at("2.55"), json=flavor(description="\x00")
    )
    assert "flavor.description" in fault(described, 400)
    image = await client.post(
        "/image/v2/images", headers=ADMIN, json={"name": "i", "os_distro": "x\x00"}
    )
    assert "os_distro" in fault(image, 400)
    server = {"server": {"name": "s\x00", "imageRef": "x", "flavorRef": "1"}}
    assert "server.name" in fault(
        await client.post("/v2.1/servers", headers=MEMBER, json=server), 400
    )
    reason = {"status": "disabled", "disabled_reason": "\x00"}
    updated = await client.put(
        "/v2.1/os-services/00000000-0000-0000-0000-000000000000", headers=at("2.53"), json=reason
    )
    assert "disabled_reason" in fault(updated, 400)


async def test_nul_deep_in_a_body_and_in_field_names_is_400(client: httpx.AsyncClient) -> None:
    deep = {"server": {"name": "s", "networks": [{"uuid": "net\x00"}]}}
    assert "server.networks[0].uuid" in fault(
        await client.post("/v2.1/servers", headers=MEMBER, json=deep), 400
    )
    keyed = {"name": "i", "bad\x00key": "v"}
    assert "field name" in fault(
        await client.post("/image/v2/images", headers=ADMIN, json=keyed), 400
    )


async def test_a_lone_surrogate_is_400_with_an_encodable_message(client: httpx.AsyncClient) -> None:
    body = b'{"server": {"name": "\\ud800x", "imageRef": "x", "flavorRef": "1"}}'
    response = await client.post(
        "/v2.1/servers", headers={**MEMBER, "Content-Type": "application/json"}, content=body
    )
    message = fault(response, 400)
    assert "server.name" in message
    assert "\\ud800" in message
    keyed = b'{"name": "i", "\\udfff": "v"}'
    fault(await client.post("/v2.1/images", headers=JSON, content=keyed), 400)


async def test_a_microversion_of_ten_thousand_digits_is_a_fault(client: httpx.AsyncClient) -> None:
    huge = "2." + "1" * 10_000
    new = await client.get("/v2.1/flavors", headers=at(huge))
    assert len(fault(new, 406)) < 300
    assert new.headers["x-openstack-request-id"].startswith("req-")
    legacy = await client.get(
        "/v2.1/flavors", headers={**ADMIN, "X-OpenStack-Nova-API-Version": huge}
    )
    fault(legacy, 406)
    malformed = await client.get("/v2.1/flavors", headers=at("2." + "1" * 10_000 + "x"))
    assert len(fault(malformed, 400)) < 300


async def test_a_body_over_the_limit_is_413_and_never_read_whole(client: httpx.AsyncClient) -> None:
    big = b'{"flavor": {"name": "' + b"a" * (20 * 1024 * 1024) + b'"}}'
    response = await client.post("/v2.1/flavors", headers=JSON, content=big)
    assert "1048576 bytes" in fault(response, 413)
    assert "overLimit" in response.json()


async def test_paging_limits_of_any_size_are_bounded(client: httpx.AsyncClient) -> None:
    huge = await client.get("/v2.1/servers", headers=ADMIN, params={"limit": "9" * 30})
    assert huge.status_code == 200, huge.text
    digits = await client.get("/v2.1/flavors", headers=ADMIN, params={"limit": "9" * 5000})
    fault(digits, 400)


def client_with(
    settings: Settings,
    pool: asyncpg.Pool,
    transport: AmqpTransport,
    openapi: Literal["admin", "public", "off"],
) -> httpx.AsyncClient:
    configured = settings.model_copy(update={"api": ApiSettings(openapi=openapi)})
    app = create_app(configured, pool, ConductorAPI(transport), ComputeAPI(transport))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://keel.test")


async def test_the_openapi_document_is_for_admins_by_default(client: httpx.AsyncClient) -> None:
    fault(await client.get("/openapi.json"), 401)
    fault(await client.get("/openapi.json", headers=MEMBER), 403)
    document = (await client.get("/openapi.json", headers=ADMIN)).json()
    create = document["paths"]["/v2.1/flavors"]["post"]
    assert "requestBody" in create
    assert "422" not in create["responses"]
    assert (
        document["components"]["schemas"]["NewFlavor"]["properties"]["ram"]["maximum"]
        == INT4_OVER - 1
    )
    listed = document["paths"]["/v2.1/servers/detail"]["get"]["parameters"]
    assert {"name", "status", "limit", "marker"} <= {p["name"] for p in listed}
    assert json.dumps(document)  # serialisable as it is served


async def test_the_openapi_document_gives_real_answers_and_statuses(
    client: httpx.AsyncClient,
) -> None:
    document = (await client.get("/openapi.json", headers=ADMIN)).json()
    paths = document["paths"]
    keypairs = paths["/v2.1/os-keypairs"]["post"]["responses"]
    assert {"200", "201"} <= set(keypairs)
    assert "2.2" in keypairs["201"]["description"]
    assert {"202", "204"} <= set(paths["/v2.1/os-keypairs/{name}"]["delete"]["responses"])
    quota_body = paths["/v2.1/os-quota-sets/{project_id}"]["put"]["requestBody"]
    assert quota_body["content"]["application/json"]["schema"]["required"] == ["quota_set"]
    server = paths["/v2.1/servers/{server_id}"]["get"]["responses"]["200"]
    schema = server["content"]["application/json"]["schema"]["properties"]["server"]
    assert {"id", "status", "addresses", "accessIPv4"} <= set(schema["required"])
    network_error = paths["/network/v2.0/ports/{port_id}"]["get"]["responses"]["4XX"]
    assert "NeutronError" in json.dumps(network_error)
    bare = [
        (path, method)
        for path, operations in paths.items()
        if path.startswith("/v2.1/servers") and "{server_id}/" not in path
        for method, operation in operations.items()
        for status, answer in operation["responses"].items()
        if status.startswith("2")
        and answer.get("content", {}).get("application/json", {}).get("schema", {}).get("title")
    ]
    assert bare == []


async def test_the_openapi_document_can_be_public_or_off(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    async with client_with(settings, db_pool, transport, "public") as public:
        assert (await public.get("/openapi.json")).status_code == 200
    async with client_with(settings, db_pool, transport, "off") as off:
        fault(await off.get("/openapi.json", headers=ADMIN), 404)
