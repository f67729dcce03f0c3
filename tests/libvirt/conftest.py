"""The libvirt tier: real virtual machines under libvirtd (``make test-libvirt``).

These tests run only when asked (``KEEL_TEST_LIBVIRT=1``, which ``make test-libvirt``
sets) and skip, saying why, when the libvirt binding, libvirtd or the test guest cannot
be had on this machine. Under CI (``CI=true``) a missing piece fails instead: CI
installs and starts everything. The guest is tiny (a kernel and a busybox initramfs,
128 MiB, ``make image``) and every test runs as few guests at once as it can: they run
under software emulation, on shared cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deploy import guestimage
from tests.libvirt.images import BUILT

URI = os.environ.get("KEEL_TEST_LIBVIRT_URI", "qemu:///system")


def unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the libvirt tier cannot run under CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def libvirt_uri() -> str:
    """libvirtd's URI, once it is known to answer."""
    if os.environ.get("KEEL_TEST_LIBVIRT") != "1":
        pytest.skip("the libvirt tier runs with `make test-libvirt` (KEEL_TEST_LIBVIRT=1)")
    try:
        import libvirt  # noqa: PLC0415
    except ImportError:
        unavailable("libvirt-python is not installed (make install-libvirt)")
    try:
        libvirt.open(URI).close()
    except libvirt.libvirtError as exc:
        unavailable(f"libvirtd does not answer at {URI}: {exc.get_error_message()}")
    return URI


@pytest.fixture(scope="session")
def guest_images(libvirt_uri: str) -> Path:
    """The test guest, built into .keel/images/ if it is not there (as make image does)."""
    if guestimage.main(["--output", str(BUILT)]) != 0:
        unavailable("the test guest could not be built (see above; make image)")
    return BUILT
