"""The opt-in Debian tier (``make test-debian``): the real cloud-init reads keel's data.

Runs only with ``KEEL_TEST_DEBIAN=1`` (which ``make test-debian`` sets, after ``make
image-debian``), on top of what the libvirt tier needs; skipped otherwise, saying why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deploy import debianimage
from tests.libvirt.conftest import guest_images, libvirt_uri, unavailable
from tests.libvirt.images import BUILT

__all__ = ["guest_images", "libvirt_uri"]


@pytest.fixture(scope="session")
def debian_images(libvirt_uri: str) -> Path:
    """The Debian guest, built in .keel/images/ (``make image-debian``)."""
    if os.environ.get("KEEL_TEST_DEBIAN") != "1":
        pytest.skip("the Debian tier runs with `make test-debian` (KEEL_TEST_DEBIAN=1)")
    if not debianimage.is_built(BUILT):
        unavailable("the Debian guest is not built: `make image-debian` builds it")
    return BUILT
