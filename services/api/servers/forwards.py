"""The loopback forwards of servers' SSH, shown among their addresses.

A libvirt agent in user-mode networking (``KEEL_LIBVIRT__NETWORK=user``) gives each
guest a private network of its own and forwards the guest's port 22 from a loopback
address of the host (:func:`~shared.objects.network.forward_address`). With
``KEEL_NETWORK__FORWARD_NAME`` set, keel-api shows that address as a second network of
the server, so ``openstack server show`` says where to SSH to and a client that connects
to a server's address on one named network (Tempest's ``network_for_ssh``) reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from uuid import UUID

from shared.objects.network import FixedIp, forward_address


def with_forwards(
    held: Mapping[UUID, Sequence[FixedIp]], forward_name: str | None
) -> dict[UUID, list[FixedIp]]:
    """Each server's fixed addresses followed, when ``forward_name`` is set, by the
    forward of its first IPv4 address (the one its guest's interface has: a server on
    several networks has no forward for the others) on the network of that name."""
    shown = {instance: list(addresses) for instance, addresses in held.items()}
    if forward_name is None:
        return shown
    for addresses in shown.values():
        first = next((fixed for fixed in addresses if fixed.version == 4), None)
        if first is not None:
            update = {"network_name": forward_name, "address": forward_address(first.address)}
            addresses.append(first.model_copy(update=update))
    return shown
