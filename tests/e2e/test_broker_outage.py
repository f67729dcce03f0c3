"""A real broker outage during 200 concurrent boots: nothing restarts, nothing is lost.

Every keel process reaches RabbitMQ through a proxy the test cuts and restores (the
shared server itself is never touched): connections drop at once and new ones are
refused, as when RabbitMQ stops. Twenty clients keep creating servers meanwhile. A
create the API answered 202 must end ACTIVE or ERROR once the broker is back; one it
could not hand to the conductor is answered 503 and leaves no server. No process is
restarted, every build holds one claim, and every node's usage is the sum of its claims.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.broker import AMQP_URL
from tests.e2e.cloud import Cloud, CloudConfig
from tests.e2e.outage import (
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

HOSTS = tuple(f"bo-{i}" for i in range(1, 5))
BOOTS = 200
CLIENTS = 20
OUTAGE_S = 8.0
SETTLE = 180.0


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[TcpProxy]:
    async with proxy_to(AMQP_URL, 5672) as running:
        yield running


@pytest.fixture(scope="module")
def cloud_config(proxy: TcpProxy) -> CloudConfig:
    return boot_cloud(HOSTS, broker_address=proxy.address)


async def test_every_accepted_boot_settles_after_a_broker_outage(
    cloud: Cloud, proxy: TcpProxy
) -> None:
    pids = pids_of(cloud)
    await unlimited_quota(cloud)
    results = await boots_across_an_outage(
        cloud, proxy, prefix="bo", boots=BOOTS, clients=CLIENTS, outage=OUTAGE_S
    )
    accepted = [b.server_id for b in results if b.server_id is not None]
    refused = [b.code for b in results if b.server_id is None]
    assert len(results) == BOOTS
    assert set(refused) <= {503}, refused
    assert len(accepted) >= BOOTS // 2
    await assert_settled_whole(cloud, accepted, SETTLE)
    assert_nothing_restarted(cloud, pids)
