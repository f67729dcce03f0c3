"""The partitions tier: compute agents on hosts of their own, cut off for real.

These tests run only when asked (``KEEL_TEST_PARTITIONS=1``, which ``make
test-partitions`` sets) and need root, iproute2 and util-linux: elsewhere they skip,
saying why. Under CI (``CI=true``) a missing piece fails instead: CI runs as root and
installs iproute2. Each module gets its own control plane (conductor, scheduler,
keel-api, as the end-to-end tier starts them) and its own run of namespaces, removed
afterwards even when a test fails.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Generator, Iterator
from urllib.parse import urlsplit

import pytest

from devkit.database import Scratch
from devkit.partitions import Partitions, unsupported
from devkit.servers import AMQP_URL
from tests.e2e.cloud import Cloud, CloudConfig, running_cloud
from tests.partitions.harness import Hosts, config


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the partitions tier cannot run under CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def partitions() -> Iterator[Partitions]:
    if os.environ.get("KEEL_TEST_PARTITIONS") != "1":
        pytest.skip("the partitions tier runs with `make test-partitions` (KEEL_TEST_PARTITIONS=1)")
    why = unsupported()
    if why is not None:
        _unavailable(why)
    broker = urlsplit(AMQP_URL)
    with Partitions.open((broker.hostname or "127.0.0.1", broker.port or 5672)) as run:
        yield run


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return config()


@pytest.fixture(scope="module")
async def cloud(
    partitions: Partitions,
    cloud_config: CloudConfig,
    databases: Scratch,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Cloud]:
    workdir = tmp_path_factory.mktemp("partitioned")
    async with running_cloud(workdir, cloud_config, databases) as running:
        yield running


@pytest.fixture(scope="module")
def hosts(cloud: Cloud, partitions: Partitions) -> Hosts:
    return Hosts(cloud, partitions)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    running = getattr(item, "funcargs", {}).get("cloud")
    if report.failed and isinstance(running, Cloud):
        for name, text in running.log_tails():
            report.sections.append((f"keel log: {name}", text))
    return report
