"""Flavor bodies at a microversion: ``description`` from 2.55, ``extra_specs`` from 2.61,
``swap`` always an integer from 2.75, no ``rxtx_factor`` or ``OS-FLV-DISABLED:disabled``
from 2.102."""

from __future__ import annotations

from typing import Any

from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from shared.objects.flavor import Flavor


def flavor_summary(flavor: Flavor, version: APIVersion, links: Links) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": flavor.flavorid,
        "name": flavor.name,
        "links": links.resource("flavors", flavor.flavorid),
    }
    if version.at_least("2.55"):
        body["description"] = flavor.description
    return body


def flavor_detail(flavor: Flavor, version: APIVersion, links: Links) -> dict[str, Any]:
    body = flavor_summary(flavor, version, links)
    body.update(
        {
            "ram": flavor.memory_mb,
            "disk": flavor.root_gb,
            "vcpus": flavor.vcpus,
            "OS-FLV-EXT-DATA:ephemeral": flavor.ephemeral_gb,
            "os-flavor-access:is_public": flavor.is_public,
            # Before 2.75 the compute API writes "no swap" as an empty string, from
            # 2.75 as 0, so the field is always an integer.
            "swap": flavor.swap if flavor.swap or version.at_least("2.75") else "",
        }
    )
    if not version.at_least("2.102"):
        body["OS-FLV-DISABLED:disabled"] = flavor.disabled
        body["rxtx_factor"] = flavor.rxtx_factor
    if version.at_least("2.61"):
        body["extra_specs"] = {str(k): str(v) for k, v in flavor.extra_specs.items()}
    return body
