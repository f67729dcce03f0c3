"""What an agent is told of a guest for its config drive (compute RPC 1.10).

The same for a first build and for every move's rebuild: the guest's config drive is
made anew wherever it is built, from what the server was created with.
"""

from __future__ import annotations

from typing import Any

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
