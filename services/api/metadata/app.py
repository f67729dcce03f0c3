"""The metadata service's application: OpenStack's and EC2's layouts, signed requests only.

Every request must say which guest it comes from in ``X-Instance-ID`` and prove it with
``X-Instance-ID-Signature``, the HMAC of that id under ``KEEL_METADATA__SECRET``, as
Nova's metadata service requires of Neutron's proxy. Only an agent holds the secret, and
it adds the two headers itself (dropping any the guest sent), naming the guest whose
forward the request came through, so a guest cannot ask as another. A request without
them is a 400, with a wrong signature a 403, for a server that does not exist (or was
deleted) a 404; nothing else is said of other servers.

Paths (each version of a layout answers like its ``latest``; directories list their
entries one a line, subdirectories ending with ``/``):

* ``/openstack``, ``/openstack/<version>``, ``/openstack/<version>/<file>``;
* ``/``, ``/<ec2 version>``, ``/<ec2 version>/user-data``,
  ``/<ec2 version>/meta-data/<path>`` (``public-keys/`` lists ``0=<key name>``).
"""

from __future__ import annotations

import hmac
import logging
from typing import Any
from uuid import UUID

import asyncpg
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from shared.config import MetadataSettings
from shared.db import fixed_ips, instances
from shared.guest_metadata import (
    EC2_VERSIONS,
    OPENSTACK_VERSIONS,
    GuestInfo,
    ec2_meta_data,
    openstack_files,
    signature,
    user_data_bytes,
)

LOG = logging.getLogger(__name__)


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _listing(names: list[str]) -> PlainTextResponse:
    return PlainTextResponse("\n".join(names))


async def guest_of(request: Request, settings: MetadataSettings, pool: asyncpg.Pool) -> GuestInfo:
    """The guest a request comes from, as its agent signed it."""
    instance_id = request.headers.get("x-instance-id")
    signed = request.headers.get("x-instance-id-signature")
    if not instance_id or not signed:
        raise Refused(400, "X-Instance-ID header is missing")
    assert settings.secret is not None
    if not hmac.compare_digest(signed, signature(settings.secret, instance_id)):
        LOG.warning("metadata request for %s with a bad signature: refused", instance_id)
        raise Refused(403, "Invalid proxy request signature.")
    try:
        instance_uuid = UUID(instance_id)
    except ValueError:
        raise Refused(404, "Instance not found") from None
    async with pool.acquire() as conn:
        instance = await instances.find(conn, instance_uuid)
        if instance is None or instance.deleted_at is not None:
            raise Refused(404, "Instance not found")
        addresses = await fixed_ips.for_instance(conn, instance_uuid)
    return GuestInfo(
        uuid=instance.uuid,
        name=instance.display_name,
        project_id=instance.project_id,
        availability_zone=instance.availability_zone,
        launch_index=instance.launch_index,
        flavor_name=instance.flavor.name,
        key_name=instance.key_name,
        key_data=instance.key_data,
        metadata=instance.metadata,
        user_data=instance.user_data,
        addresses=addresses,
        hostname=instance.hostname,
    )


def openstack(guest: GuestInfo, parts: list[str]) -> Response:
    versions = [*OPENSTACK_VERSIONS, "latest"]
    if not parts:
        return _listing(versions)
    version, *rest = parts
    if version not in versions or len(rest) > 1:
        raise Refused(404, "Not found")
    files = openstack_files(guest, version)
    if not rest:
        return _listing(sorted(files))
    if rest[0] not in files:
        raise Refused(404, "Not found")
    media = "application/json" if rest[0].endswith(".json") else "text/plain"
    return Response(files[rest[0]], media_type=media)


def ec2(guest: GuestInfo, parts: list[str]) -> Response:
    versions = [*EC2_VERSIONS, "latest"]
    if not parts:
        return _listing(versions)
    version, *rest = parts
    if version not in versions:
        raise Refused(404, "Not found")
    user_data = user_data_bytes(guest)
    if not rest:
        return _listing(["meta-data/", *(["user-data"] if user_data is not None else [])])
    if rest == ["user-data"] and user_data is not None:
        return Response(user_data, media_type="text/plain")
    if rest[0] != "meta-data":
        raise Refused(404, "Not found")
    node: Any = ec2_meta_data(guest)
    for part in rest[1:]:
        if not isinstance(node, dict) or part not in node or part.startswith("_"):
            raise Refused(404, "Not found")
        node = node[part]
    if not isinstance(node, dict):
        return PlainTextResponse(str(node))
    if rest[1:] == ["public-keys"]:
        return _listing([f"{index}={key['_name']}" for index, key in node.items()])
    entries = [key for key in node if not key.startswith("_")]
    return _listing([f"{key}/" if isinstance(node[key], dict) else key for key in entries])


def create_metadata_app(settings: MetadataSettings, pool: asyncpg.Pool) -> FastAPI:
    app = FastAPI(title="keel-metadata", openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/{path:path}")
    async def answer(request: Request, path: str) -> Response:
        try:
            guest = await guest_of(request, settings, pool)
            parts = [part for part in path.split("/") if part]
            if parts[:1] == ["openstack"]:
                return openstack(guest, parts[1:])
            return ec2(guest, parts)
        except Refused as refused:
            return PlainTextResponse(refused.message, status_code=refused.status)

    return app
