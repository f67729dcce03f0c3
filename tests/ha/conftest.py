"""The HA tier: keel against clusters the tests start, break and tear down themselves.

One three-node RabbitMQ cluster serves the whole tier (it takes half a minute to
start); each test gets it with every node running again, whatever the test before did
to it. So does one PostgreSQL pair under Patroni (with its etcd): a test that kills the
primary leaves Patroni to promote the standby and bring the old primary back as the new
one's synchronous standby, and the next test starts once it has. Each test makes its
own database on it. The machine's own servers are never touched.

The cloud these tests break is the fault benchmark's (``bench/benchkit/ha.py``), so the
benchmark and the tests measure the same thing.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Generator

import pytest

from devkit import ROOT
from devkit.broker import remove_exchange
from devkit.pg_cluster import PgCluster, pg_cluster
from devkit.rabbit_cluster import RabbitCluster, rabbit_cluster

# The benchmark harness (``benchkit``) lives beside the benchmark scripts.
sys.path.insert(0, str(ROOT / "bench"))


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Note in the test item whether its call failed, for fixtures that keep logs."""
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


def failed(request: pytest.FixtureRequest) -> bool:
    item: pytest.Item = request.node
    return item.stash.get(FAILED, False)


@pytest.fixture(scope="session")
async def rabbit_nodes() -> AsyncIterator[RabbitCluster]:
    async with rabbit_cluster(3) as cluster:
        yield cluster


@pytest.fixture
async def rabbit(rabbit_nodes: RabbitCluster) -> RabbitCluster:
    """The tier's RabbitMQ cluster, every node running."""
    await rabbit_nodes.all_running()
    return rabbit_nodes


@pytest.fixture
async def cluster_exchange(rabbit: RabbitCluster) -> AsyncIterator[str]:
    """An exchange of the test's own on the cluster; removed afterwards."""
    name = f"keel-ha-{uuid.uuid4().hex[:12]}"
    yield name
    await rabbit.all_running()
    await remove_exchange(name, url=rabbit.node_url(rabbit.nodes[0]))


@pytest.fixture(scope="session")
async def postgres_pair() -> AsyncIterator[PgCluster]:
    async with pg_cluster() as cluster:
        yield cluster


@pytest.fixture
async def postgres(postgres_pair: PgCluster) -> PgCluster:
    """The tier's PostgreSQL primary with a synchronous standby (whichever server is
    primary now), both running and replicating."""
    await postgres_pair.await_synchronous()
    return postgres_pair
