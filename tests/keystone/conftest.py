"""The Keystone tier: a real Keystone (from PyPI, in ``.keystone-venv``), and keel-api
pointed at it with ``KEEL_IDENTITY__KEYSTONE_URL`` and a service user of its own.

Without the virtualenv every test skips, saying how to build it (``make test-keystone``
does); under CI (``CI=true``) that fails instead.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devkit import ROOT
from devkit.database import Scratch
from tests.e2e.cloud import Cloud, CloudConfig, running_cloud
from tests.keystone.server import Admin, Keystone, running_keystone

#: Seconds keel-api trusts a token Keystone validated: the bound the tests check.
CACHE_TIME = 10.0
SERVICE_PASSWORD = secrets.token_urlsafe(18)


def keystone_venv() -> Path:
    venv = Path(os.environ.get("KEEL_KEYSTONE_VENV", ROOT / ".keystone-venv"))
    if not (venv / "bin" / "keystone-manage").exists() or not (venv / "bin" / "gunicorn").exists():
        why = f"no Keystone in {venv}: run `make test-keystone`, which installs it there"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return venv.absolute()


@pytest.fixture(scope="module")
async def keystone(
    databases: Scratch, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Keystone]:
    venv = keystone_venv()
    async with running_keystone(venv, tmp_path_factory.mktemp("keystone"), databases) as server:
        yield server


@pytest.fixture(scope="module")
def admin(keystone: Keystone) -> Iterator[Admin]:
    """Keystone's admin, having made keel's service user (role ``service`` in ``service``)."""
    client = Admin(keystone)
    client.member("keel", SERVICE_PASSWORD, "service", role="service")
    yield client
    client.close()


@pytest.fixture(scope="module")
async def cloud(
    keystone: Keystone,
    admin: Admin,
    databases: Scratch,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Cloud]:
    """keel behind Keystone, registered in Keystone's catalog."""
    config = CloudConfig(
        env=(
            ("KEEL_IDENTITY__KEYSTONE_URL", keystone.v3),
            ("KEEL_IDENTITY__KEYSTONE_USERNAME", "keel"),
            ("KEEL_IDENTITY__KEYSTONE_PASSWORD", SERVICE_PASSWORD),
            ("KEEL_IDENTITY__TOKEN_CACHE_TIME", f"{CACHE_TIME:g}"),
        )
    )
    workdir = tmp_path_factory.mktemp("cloud")
    async with running_cloud(workdir, config, databases) as running:
        admin.register_keel(running.api_url)
        yield running
