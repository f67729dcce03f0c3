"""Flavors through the API."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import ADMIN, MEMBER, Recorder, add_image, at
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

SEEDED = ["1", "2", "3", "4", "5"]


async def test_list_and_detail_show_the_seeded_flavors(client: httpx.AsyncClient) -> None:
    listed = await client.get("/v2.1/flavors", headers=MEMBER)
    assert [f["id"] for f in listed.json()["flavors"]] == SEEDED
    detail = await client.get(
        "/v2.1/flavors/detail", headers=at("2.61", MEMBER), params={"is_public": "None"}
    )
    tiny = detail.json()["flavors"][0]
    assert (tiny["name"], tiny["ram"], tiny["vcpus"], tiny["disk"]) == ("m1.tiny", 512, 1, 1)
    assert tiny["extra_specs"] == {}
    assert tiny["swap"] == ""


async def test_filters_and_paging(client: httpx.AsyncClient) -> None:
    big = await client.get("/v2.1/flavors", headers=MEMBER, params={"minRam": 8192})
    assert [f["name"] for f in big.json()["flavors"]] == ["m1.large", "m1.xlarge"]
    page = await client.get("/v2.1/flavors", headers=MEMBER, params={"limit": 2, "marker": "2"})
    assert [f["id"] for f in page.json()["flavors"]] == ["3", "4"]
    assert "marker=4" in page.json()["flavors_links"][0]["href"]


async def test_show(client: httpx.AsyncClient) -> None:
    shown = await client.get("/v2.1/flavors/3", headers=MEMBER)
    assert shown.json()["flavor"]["name"] == "m1.medium"
    missing = await client.get("/v2.1/flavors/m1.medium", headers=MEMBER)
    assert missing.status_code == 404
    specs = await client.get("/v2.1/flavors/3/os-extra_specs", headers=MEMBER)
    assert specs.json() == {"extra_specs": {}}


async def test_admin_creates_and_deletes_a_flavor(client: httpx.AsyncClient) -> None:
    body = {
        "flavor": {
            "name": "c1.private",
            "id": None,
            "ram": 1024,
            "vcpus": 2,
            "disk": 10,
            "OS-FLV-EXT-DATA:ephemeral": 5,
            "swap": 256,
            "rxtx_factor": 1.0,
            "os-flavor-access:is_public": False,
            "description": "for tests",
        }
    }
    created = await client.post("/v2.1/flavors", headers=at("2.55"), json=body)
    assert created.status_code == 200, created.text
    flavor = created.json()["flavor"]
    assert flavor["id"]
    assert flavor["OS-FLV-EXT-DATA:ephemeral"] == 5
    assert flavor["swap"] == 256
    assert flavor["description"] == "for tests"

    public = await client.get("/v2.1/flavors", headers=ADMIN)
    assert flavor["id"] not in [f["id"] for f in public.json()["flavors"]]
    everything = await client.get("/v2.1/flavors", headers=ADMIN, params={"is_public": "none"})
    assert flavor["id"] in [f["id"] for f in everything.json()["flavors"]]

    duplicate = await client.post("/v2.1/flavors", headers=at("2.55"), json=body)
    assert duplicate.status_code == 409

    deleted = await client.delete(f"/v2.1/flavors/{flavor['id']}", headers=ADMIN)
    assert deleted.status_code == 202
    assert (await client.get(f"/v2.1/flavors/{flavor['id']}", headers=ADMIN)).status_code == 404


async def test_members_cannot_manage_flavors(client: httpx.AsyncClient) -> None:
    body = {"flavor": {"name": "x", "ram": 1, "vcpus": 1, "disk": 1}}
    assert (await client.post("/v2.1/flavors", headers=MEMBER, json=body)).status_code == 403
    assert (await client.delete("/v2.1/flavors/1", headers=MEMBER)).status_code == 403


async def test_bad_flavor_bodies_are_400(client: httpx.AsyncClient) -> None:
    for flavor in (
        {"name": "x", "ram": "lots", "vcpus": 1, "disk": 1},
        {"name": "x", "ram": 1, "vcpus": 0, "disk": 1},
        {"ram": 1, "vcpus": 1, "disk": 1},
        {"name": "x", "ram": 1, "vcpus": 1, "disk": 1, "colour": "red"},
    ):
        response = await client.post("/v2.1/flavors", headers=ADMIN, json={"flavor": flavor})
        assert response.status_code == 400, flavor
    described = {"name": "x", "ram": 1, "vcpus": 1, "disk": 1, "description": "too early"}
    early = await client.post("/v2.1/flavors", headers=at("2.54"), json={"flavor": described})
    assert early.status_code == 400


@pytest.mark.parametrize(("given", "stored"), [(4711, "4711"), (2.5, "2.5"), ("x.1 y", "x.1 y")])
async def test_a_flavor_id_may_be_a_number_or_a_string(
    client: httpx.AsyncClient, given: object, stored: str
) -> None:
    body = {"flavor": {"name": f"by-id-{stored}", "id": given, "ram": 64, "vcpus": 1, "disk": 0}}
    created = await client.post("/v2.1/flavors", headers=ADMIN, json=body)
    assert created.status_code == 200, created.text
    assert created.json()["flavor"]["id"] == stored
    shown = await client.get(f"/v2.1/flavors/{stored}", headers=ADMIN)
    assert shown.json()["flavor"]["name"] == f"by-id-{stored}"


@pytest.mark.parametrize("given", ["", " lead", "trail ", "a/b", True, [], {}])
async def test_a_malformed_flavor_id_is_400(client: httpx.AsyncClient, given: object) -> None:
    body = {"flavor": {"name": "bad-id", "id": given, "ram": 64, "vcpus": 1, "disk": 0}}
    created = await client.post("/v2.1/flavors", headers=ADMIN, json=body)
    assert created.status_code == 400, created.text
    assert "flavor.id" in created.json()["badRequest"]["message"]


async def test_a_private_flavor_is_the_admins_only(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    body = {
        "flavor": {
            "name": "hidden",
            "id": "hidden",
            "ram": 64,
            "vcpus": 1,
            "disk": 0,
            "os-flavor-access:is_public": False,
        }
    }
    assert (await client.post("/v2.1/flavors", headers=ADMIN, json=body)).status_code == 200
    assert (await client.get("/v2.1/flavors/hidden", headers=ADMIN)).status_code == 200
    for path in ("/v2.1/flavors/hidden", "/v2.1/flavors/hidden/os-extra_specs"):
        assert (await client.get(path, headers=MEMBER)).status_code == 404, path
    refused = await client.post(
        "/v2.1/servers", headers=MEMBER, json=server_body(flavorRef="hidden")
    )
    assert refused.status_code == 400
    assert refused.json()["badRequest"]["message"] == "Flavor hidden could not be found."
    taken = await client.post("/v2.1/servers", headers=ADMIN, json=server_body(flavorRef="hidden"))
    assert taken.status_code == 202, taken.text


async def test_admins_set_change_and_delete_extra_specs(client: httpx.AsyncClient) -> None:
    base = "/v2.1/flavors/3/os-extra_specs"
    added = await client.post(base, headers=ADMIN, json={"extra_specs": {"hw:cpu": "2", "n": 4}})
    assert added.status_code == 200, added.text
    assert added.json() == {"extra_specs": {"hw:cpu": "2", "n": "4"}}
    listed = await client.get(base, headers=MEMBER)
    assert listed.json() == {"extra_specs": {"hw:cpu": "2", "n": "4"}}
    changed = await client.put(f"{base}/n", headers=ADMIN, json={"n": "5"})
    assert changed.json() == {"n": "5"}
    assert (await client.get(f"{base}/n", headers=MEMBER)).json() == {"n": "5"}
    shown = await client.get("/v2.1/flavors/3", headers=at("2.61", MEMBER))
    assert shown.json()["flavor"]["extra_specs"] == {"hw:cpu": "2", "n": "5"}

    deleted = await client.delete(f"{base}/n", headers=ADMIN)
    assert deleted.status_code == 200
    missing = await client.get(f"{base}/n", headers=MEMBER)
    assert missing.status_code == 404
    assert missing.json()["itemNotFound"]["message"] == "Flavor 3 has no extra specs with key n."
    assert (await client.delete(f"{base}/n", headers=ADMIN)).status_code == 404

    for method, path, body in (
        ("PUT", f"{base}/a", {"b": "1"}),
        ("PUT", f"{base}/a", {"a": "1", "b": "2"}),
        ("PUT", f"{base}/a", {"a": True}),
        ("POST", base, {"extra_specs": {"bad/key": "1"}}),
        ("POST", base, {"extra_specs": {"k": "v" * 256}}),
        ("POST", base, {"specs": {}}),
    ):
        answer = await client.request(method, path, headers=ADMIN, json=body)
        assert answer.status_code == 400, (method, path, body)
    for method, path in (("POST", base), ("PUT", f"{base}/a"), ("DELETE", f"{base}/hw:cpu")):
        body = {"extra_specs": {"a": "1"}} if method == "POST" else {"a": "1"}
        refused = await client.request(method, path, headers=MEMBER, json=body)
        assert refused.status_code == 403, (method, path)
    assert (await client.post("/v2.1/flavors/nope/os-extra_specs", headers=ADMIN,
                              json={"extra_specs": {"a": "1"}})).status_code == 404  # fmt: skip


async def test_admins_change_a_flavors_description_from_2_55(client: httpx.AsyncClient) -> None:
    body = {"flavor": {"description": "small and cheap"}}
    changed = await client.put("/v2.1/flavors/1", headers=at("2.55"), json=body)
    assert changed.status_code == 200, changed.text
    assert changed.json()["flavor"]["description"] == "small and cheap"
    shown = await client.get("/v2.1/flavors/1", headers=at("2.55", MEMBER))
    assert shown.json()["flavor"]["description"] == "small and cheap"
    cleared = await client.put(
        "/v2.1/flavors/1", headers=at("2.55"), json={"flavor": {"description": None}}
    )
    assert cleared.json()["flavor"]["description"] is None
    assert (await client.put("/v2.1/flavors/1", headers=at("2.54"), json=body)).status_code == 404
    assert (
        await client.put("/v2.1/flavors/1", headers=at("2.55", MEMBER), json=body)
    ).status_code == 403
    bads: list[dict[str, object]] = [
        {"flavor": {}},
        {"flavor": {"name": "x"}},
        {"description": "x"},
    ]
    for bad in bads:
        assert (
            await client.put("/v2.1/flavors/1", headers=at("2.55"), json=bad)
        ).status_code == 400
    assert (
        await client.put("/v2.1/flavors/nope", headers=at("2.55"), json=body)
    ).status_code == 404
