"""The SSH forward shown among a server's addresses: its first IPv4 address's only."""

from __future__ import annotations

import uuid

from services.api.servers.forwards import with_forwards
from shared.objects.network import FixedIp, mac_address

NET_A, NET_B = uuid.uuid4(), uuid.uuid4()


def fixed(network: uuid.UUID, name: str, address: str) -> FixedIp:
    return FixedIp(
        network_id=network, network_name=name, address=address, mac=mac_address(network, address)
    )


def test_a_server_on_several_networks_shows_one_forward_for_its_first_address() -> None:
    server = uuid.uuid4()
    held = {server: [fixed(NET_A, "a", "10.1.2.3"), fixed(NET_B, "b", "10.9.8.7")]}
    shown = with_forwards(held, "forwarded")[server]
    assert [(f.network_name, f.address) for f in shown] == [
        ("a", "10.1.2.3"),
        ("b", "10.9.8.7"),
        ("forwarded", "127.1.2.3"),
    ]
    assert with_forwards(held, None)[server] == held[server]
    assert with_forwards({server: []}, "forwarded") == {server: []}
