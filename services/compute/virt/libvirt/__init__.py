"""The libvirt virt driver (``KEEL_COMPUTE__DRIVER=libvirt``); see :mod:`.driver`."""

from __future__ import annotations

from services.compute.virt.libvirt.driver import LibvirtDriver

__all__ = ["LibvirtDriver"]
