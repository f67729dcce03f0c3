"""A database outage in the middle of concurrent boots, with compute agents running.

Every keel process reaches PostgreSQL through a proxy the test cuts for a few seconds
while ten clients create servers, each retrying a create answered 503 after a pause, as
``Retry-After`` asks. A create answered 202 must end ACTIVE or ERROR once the database is
back (none left in BUILD); a create the API could not record is a 503 with a fault body,
never a 500. When the connection drops after a commit reached the database, the client
sees a 503 for a server that exists: keel-api withdraws it once the database answers
again, so no server is left that nobody builds. No process is restarted, no log holds a
traceback, every build holds one claim and usage adds up on every node.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.e2e.cloud import PG_SERVER, Cloud, CloudConfig
from tests.e2e.outage import (
    assert_no_tracebacks,
    assert_nothing_restarted,
    assert_settled_whole,
    boot_cloud,
    boots_across_an_outage,
    pids_of,
    proxy_to,
    unlimited_quota,
)
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

HOSTS = ("do-1", "do-2", "do-3")
BOOTS = 100
CLIENTS = 10
OUTAGE_S = 6.0
SETTLE = 180.0
#: How long a client waits before it tries a refused create again.
RETRY_S = 0.5


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[TcpProxy]:
    async with proxy_to(PG_SERVER, 5432) as running:
        yield running


@pytest.fixture(scope="module")
def cloud_config(proxy: TcpProxy) -> CloudConfig:
    return boot_cloud(HOSTS, database_address=proxy.address)


async def test_boots_across_a_database_outage_all_settle(cloud: Cloud, proxy: TcpProxy) -> None:
    pids = pids_of(cloud)
    await unlimited_quota(cloud)
    results = await boots_across_an_outage(
        cloud,
        proxy,
        prefix="do",
        boots=BOOTS,
        clients=CLIENTS,
        outage=OUTAGE_S,
        retry_after=RETRY_S,
    )
    accepted = [b.server_id for b in results if b.server_id is not None]
    refused = [(b.code, b.body) for b in results if b.server_id is None]
    assert len(accepted) == BOOTS
    assert refused, "the outage refused no create: it came too late"
    assert {code for code, _ in refused} == {503}, refused
    assert all("serviceUnavailable" in body for _, body in refused)
    await assert_settled_whole(cloud, accepted, SETTLE)
    assert_nothing_restarted(cloud, pids)
    assert_no_tracebacks(cloud)
