"""keel-api against hostile clients, over real HTTP, then a look for secrets in the logs.

The cloud runs with a database URL that carries a password (the test server ignores
it), so that the last test can look for every configured secret in every log: the API
tokens, that password, and the broker's credentials. The tests before it give the
processes plenty to log: hostile requests, a schemathesis fuzzing run over the API's
own OpenAPI document, failed authentication, and the real ``openstack`` client.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.broker import AMQP_URL
from tests.e2e.cloud import BIN, Cloud, CloudConfig
from tests.e2e.fuzz_hooks import fault_problem

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DATABASE_PASSWORD = f"db-secret-{uuid.uuid4().hex}"
MiB = 1024 * 1024

#: Test cases per API operation and the seed: the same cases every run. The e2e tier
#: (CI) runs a few per operation; ``make test-fuzz`` sets ``KEEL_FUZZ_EXAMPLES`` for a
#: deeper run of this test alone.
FUZZ_EXAMPLES = int(os.environ.get("KEEL_FUZZ_EXAMPLES", "12"))
FUZZ_SEED = 20240613
#: No server error, every error a fault, and every answer's status, content type and
#: body as the document says (statuses per microversion, schemas of the answers).
CHECKS = (
    "not_a_server_error,nova_fault_body,status_code_conformance,"
    "response_schema_conformance,content_type_conformance"
)
#: The run's bound: about 2.5 s per example per operation round on two busy cores.
FUZZ_TIMEOUT = 120 + 9 * FUZZ_EXAMPLES
#: Operations left out of the run: the operator's page's JSON (a keel extension, whose
#: refusals and outages tests/functional/services/api/test_ops_*.py hold), so the run
#: stays as long as the compute, image, identity and network APIs make it.
FUZZ_EXCLUDED = "^/ops/"


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=("compute1",), database_password=DATABASE_PASSWORD)


@pytest.fixture
async def admin(cloud: Cloud) -> AsyncIterator[httpx.AsyncClient]:
    async with cloud.http(cloud.admin_token) as http:
        yield http


def assert_fault(response: httpx.Response, status: int, name: str) -> str:
    assert response.status_code == status, response.text
    assert fault_problem(status, response.text) is None, response.text
    assert response.headers["x-openstack-request-id"].startswith("req-")
    message: str = response.json()[name]["message"]
    return message


async def test_a_version_of_ten_thousand_digits_is_a_fault(admin: httpx.AsyncClient) -> None:
    huge = "2." + "9" * 10_000
    new = await admin.get("flavors", headers={"OpenStack-API-Version": f"compute {huge}"})
    assert len(assert_fault(new, 406, "notAcceptable")) < 300
    legacy = await admin.get("flavors", headers={"X-OpenStack-Nova-API-Version": huge})
    assert_fault(legacy, 406, "notAcceptable")
    garbage = await admin.get(
        "flavors", headers={"OpenStack-API-Version": "compute 2.x" + "y" * 10_000}
    )
    assert len(assert_fault(garbage, 400, "badRequest")) < 300


async def test_bodies_over_the_limit_are_refused_with_413(admin: httpx.AsyncClient) -> None:
    declared = await admin.post(
        "flavors", content=b" " * (MiB + 1), headers={"Content-Type": "application/json"}
    )
    assert_fault(declared, 413, "overLimit")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: sent chunked
        for _ in range(20):
            yield b" " * (128 * 1024)

    chunked = await admin.post(
        "flavors", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert "content-length" not in chunked.request.headers
    assert_fault(chunked, 413, "overLimit")
    # Just under the limit is read (and is not a flavor).
    small = await admin.post(
        "flavors", content=b" " * (MiB - 10) + b"{}", headers={"Content-Type": "application/json"}
    )
    assert_fault(small, 400, "badRequest")
    assert (await admin.get("flavors")).status_code == 200


async def test_text_postgresql_cannot_store_is_a_400(admin: httpx.AsyncClient) -> None:
    assert_fault(await admin.get("flavors/a%00b"), 400, "badRequest")
    assert_fault(await admin.get("servers/detail", params={"name": "a\x00"}), 400, "badRequest")
    surrogate = b'{"server": {"name": "\\ud800", "imageRef": "x", "flavorRef": "1"}}'
    response = await admin.post(
        "servers", content=surrogate, headers={"Content-Type": "application/json"}
    )
    assert "\\ud800" in assert_fault(response, 400, "badRequest")


@pytest.mark.parametrize("microversion", ["latest", "2.1"])
@pytest.mark.timeout(FUZZ_TIMEOUT + 30)  # the run's own bound, not the default 120 s
def test_fuzzing_the_openapi_document_finds_no_server_error_and_no_deviation(
    cloud: Cloud, tmp_path: Path, microversion: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "SCHEMATHESIS_"))}
    env.update(SCHEMATHESIS_HOOKS="tests.e2e.fuzz_hooks", PYTHONPATH=str(ROOT))
    before = cloud.logs()["api"].count(" status ")
    argv = [
        str(BIN / "st"), "run", f"{cloud.api_url}/openapi.json",
        "--header", f"X-Auth-Token: {cloud.admin_token}",
        "--header", f"OpenStack-API-Version: compute {microversion}",
        "--checks", CHECKS, "--exclude-path-regex", FUZZ_EXCLUDED,
        "--max-examples", str(FUZZ_EXAMPLES), "--seed", str(FUZZ_SEED),
        "--generation-database", "none", "--no-color",
    ]  # fmt: skip
    if microversion != "latest":
        # The identity API has no compute microversions: fuzzing it once is enough.
        argv += ["--exclude-path-regex", "^/identity"]
    run = subprocess.run(
        argv,
        cwd=tmp_path,  # where schemathesis keeps its cache
        env=env,
        capture_output=True,
        text=True,
        timeout=FUZZ_TIMEOUT,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    log = cloud.logs()["api"]
    assert log.count(" status ") - before > 500  # the fuzzer did reach the API
    assert " status 5" not in log


async def test_no_configured_secret_reaches_any_log(cloud: Cloud) -> None:
    async with cloud.http("not-" + cloud.admin_token) as wrong:
        assert (await wrong.get("servers")).status_code == 401
    async with cloud.http(cloud.member_token) as member:
        assert (await member.get("servers")).status_code == 200
    listed = await asyncio.to_thread(cloud.openstack, "server", "list", cloud="keel-member")
    assert isinstance(listed, list)

    broker = urlsplit(AMQP_URL)
    secrets = {
        "admin token": cloud.admin_token,
        "member token": cloud.member_token,
        "database password": DATABASE_PASSWORD,
        "broker credentials": f"{broker.username}:{broker.password}@",
    }
    logs = cloud.logs()
    assert set(logs) == {"conductor", "scheduler1", "compute1", "api"}
    assert all(logs.values())
    leaks = [
        f"{what} in the {name} log"
        for name, text in logs.items()
        for what, secret in secrets.items()
        if secret in text
    ]
    assert leaks == []
