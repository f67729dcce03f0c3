"""What users do every day with servers, through the real openstack CLI and openstacksdk."""

from __future__ import annotations

import asyncio
from typing import Any

import openstack
import pytest
from openstack.config.loader import OpenStackConfig

from tests.e2e.cloud import Cloud

pytestmark = pytest.mark.e2e


def sdk(cloud: Cloud, name: str = "keel") -> openstack.connection.Connection:
    region = OpenStackConfig(config_files=[str(cloud.clouds_yaml)]).get_one(cloud=name)
    return openstack.connection.Connection(config=region)


def sdk_create_and_delete(cloud: Cloud) -> tuple[Any, Any]:
    conn = sdk(cloud)
    server = conn.create_server("sdk-1", image="cirros", flavor="m1.tiny", wait=True, timeout=60)
    shown = conn.get_server(server.id)
    assert conn.delete_server(server.id, wait=True, timeout=60)
    return server, shown


async def test_the_sdk_cloud_layer_creates_a_server_with_an_address_and_deletes_it(
    cloud: Cloud,
) -> None:
    server, shown = await asyncio.to_thread(sdk_create_and_delete, cloud)
    assert server.status == "ACTIVE"
    [address] = server.addresses["private"]
    assert address["addr"].startswith("10.0.")
    assert server.private_v4 == address["addr"]
    assert shown.id == server.id
    assert cloud.openstack("server", "list") == []
