"""The clients tier runs a cloud per module, as the end-to-end tier does."""

from __future__ import annotations

from tests.e2e.conftest import cloud, cloud_config, pytest_runtest_makereport

__all__ = ["cloud", "cloud_config", "pytest_runtest_makereport"]
