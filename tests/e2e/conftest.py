"""Fixtures of the end-to-end layer: one running cloud per test module.

A module that needs a differently shaped cloud overrides :func:`cloud_config`. When a
test fails, the tail of every keel process's log is attached to its report.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator

import pytest

from devkit.database import Scratch
from tests.e2e.cloud import Cloud, CloudConfig, running_cloud


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig()


@pytest.fixture(scope="module")
async def cloud(
    cloud_config: CloudConfig, databases: Scratch, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cloud]:
    async with running_cloud(tmp_path_factory.mktemp("cloud"), cloud_config, databases) as running:
        yield running


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
