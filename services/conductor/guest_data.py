"""What an agent is told of a guest: the spec it builds from, and what the guest's config
drive says (compute RPC 1.11).

The same for a first build, for every move's rebuild and for a rebuild from a new image:
the guest's config drive is made anew wherever it is built, from what the server says.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from services.compute.rpcapi import BootSource, InstanceSpec
from shared.objects.instance import Instance


def guest_data(instance: Instance) -> dict[str, Any]:
    """The fields of an ``InstanceSpec`` that a config drive is made from."""
    return {
        "project_id": instance.project_id,
        "availability_zone": instance.availability_zone,
        "launch_index": instance.launch_index,
        "key_name": instance.key_name,
        "key_data": instance.key_data,
        "config_drive": instance.config_drive,
        "hostname": instance.hostname,
    }


def instance_spec(
    instance: Instance,
    nodename: str,
    addresses: list[object],
    boot: BootSource | None = None,
    *,
    origin: UUID | None = None,
) -> InstanceSpec:
    """What an agent needs to build ``instance``; ``origin``: the move it is built for."""
    return InstanceSpec.model_validate(
        {
            "boot": boot,
            "uuid": instance.uuid,
            "origin": origin,
            "display_name": instance.display_name,
            "flavor": instance.flavor,
            "image_ref": instance.image_ref,
            "node": nodename,
            "addresses": addresses,
            "metadata": instance.metadata,
            "user_data": instance.user_data,
            **guest_data(instance),
        }
    )
