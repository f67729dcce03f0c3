"""The client of keel-compute agents: the only way other services talk to them.

Each agent consumes its own topic, ``compute.<service-uuid>``: the routing key comes
from the service's UUID, never from a host name.

Compute RPC API history:

* 1.0 — build_and_run_instance (cast), terminate_instance (cast).
"""

from __future__ import annotations

from uuid import UUID

from pydantic import Field

from shared.context import RequestContext
from shared.objects.base import KeelModel
from shared.objects.flavor import FlavorSnapshot
from shared.objects.network import FixedIp
from shared.rpc.client import RPCClient
from shared.rpc.transport import Transport
from shared.versions import SERVICE_VERSION, apis_for

RPC_VERSION = apis_for(SERVICE_VERSION).compute


def topic_for(service_uuid: UUID) -> str:
    return f"compute.{service_uuid}"


class InstanceSpec(KeelModel):
    """What an agent needs to build a guest."""

    uuid: UUID
    display_name: str = Field(max_length=255)
    flavor: FlavorSnapshot
    image_ref: str = ""
    node: str
    #: What the guest is told at first boot: its fixed addresses, the server's
    #: metadata and the user data (base64, as the user gave it).
    addresses: list[FixedIp] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    user_data: str | None = None


class BuildAndRunInstance(KeelModel):
    instance: InstanceSpec


class TerminateInstance(KeelModel):
    instance_uuid: UUID


class ComputeAPI:
    def __init__(
        self, transport: Transport, *, version_cap: str = RPC_VERSION, timeout: float = 60.0
    ) -> None:
        self.client = RPCClient(transport, "compute", version_cap=version_cap, timeout=timeout)

    async def build_and_run_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance: InstanceSpec
    ) -> None:
        await self.client.for_topic(topic_for(service_uuid)).cast(
            ctx, "build_and_run_instance", BuildAndRunInstance(instance=instance), version="1.0"
        )

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self.client.for_topic(topic_for(service_uuid)).cast(
            ctx, "terminate_instance", TerminateInstance(instance_uuid=instance_uuid), version="1.0"
        )
