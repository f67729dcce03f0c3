"""``POST /servers/{id}/action {"createImage": {"name": ..., "metadata": {...}}}``: a
snapshot of the server's disk, as a new image in keel's Image API.

As in Nova: the server must be ACTIVE, SHUTOFF, PAUSED or SUSPENDED with no task (409
otherwise) and not locked (409, unless the caller is an admin); the body is a ``name``
(1 to 255 characters, no surrounding whitespace) and optional ``metadata`` (400 if
anything else); more properties than the project's ``metadata_items`` quota is a 403.
The answer is 202 with the image's URL in ``Location`` before microversion 2.45, and
``{"image_id": ...}`` from 2.45.

keel-api writes, in one transaction, the server's task ``image_snapshot`` (a
compare-and-swap) and the image: ``queued``, private to the server's project, with the
properties a snapshot has in Nova and Glance (``image_type=snapshot``,
``instance_uuid``, ``base_image_ref``, ``user_id``, ``owner_id``, what the server kept
of its image's properties, the request's metadata over them), the base image's disk
format, and ``min_disk``/``min_ram`` the server's flavor and image need. It then casts
``snapshot_instance`` (compute RPC 1.15) to the server's agent with a signed upload URL
(:mod:`shared.image_urls`). The agent writes the guest's disk to that URL (keel-api
moves the task to ``image_pending_upload`` as the upload arrives, to
``image_uploading`` as the data streams, and makes the image ``active`` with its size
and hashes once whole), then reports a ``snapshot`` result to the conductor (RPC 1.16),
which ends the task; a failed snapshot's image is killed, the server stays as it was.
So does one no agent finished within ``KEEL_TASK_TIMEOUT``.

Refused with 409, nothing changed: the server's compute service is down or has no
queue, the deployment signs no image URLs (``KEEL_IMAGES__URL_SECRET`` unset), or the
RPC caps are below what a snapshot needs (naming the services too old). If the message
cannot be confirmed sent and no agent took it, the task is cleared, the image killed,
and the answer is 503.

``createBackup`` (:mod:`.backup`) takes its snapshot the same way
(:func:`take_snapshot`), with properties of its own and a rotation.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
from fastapi import Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from services.api.http.faults import BadRequest, ConflictingRequest, ServiceUnavailable
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.resources.quotas import check_metadata_items, project_limits
from services.api.servers import publish
from services.api.servers.fields import Metadata, ServerName
from services.api.servers.lookup import host_service
from services.api.servers.power import state_conflict, too_old
from services.compute.rpcapi import ComputeAPI, SnapshotInstance
from services.conductor.rpcapi import ACTION_RESULT_SINCE, ConductorAPI, PowerAction
from shared import image_urls
from shared.config import Settings
from shared.context import RequestContext
from shared.db import images, instance_actions, snapshots
from shared.db.pool import Connection
from shared.exceptions import ImageNotFound, Unroutable
from shared.objects.image import Image
from shared.objects.instance import Instance

LOG = logging.getLogger(__name__)

ACTION = "createImage"
_METHOD = "snapshot_instance"
#: The microversion from which the answer is a body, not a ``Location``.
BODY_SINCE = "2.45"
#: The disk formats an agent writes a snapshot in; any other base image's gives qcow2.
DISK_FORMATS = ("qcow2", "raw")


class CreateImageRequest(BaseModel):
    """The ``createImage`` value, as Nova's schema has it (anything else is a 400)."""

    model_config = ConfigDict(extra="forbid")

    name: ServerName
    metadata: Metadata | None = None


def parse(value: Any) -> CreateImageRequest:
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute createImage: it must be an object.")
    try:
        return CreateImageRequest.model_validate(value)
    except ValidationError as exc:
        errors = [{**error, "loc": ("createImage", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None


async def _base_image(conn: Connection, instance: Instance) -> Image | None:
    try:
        return await images.get(conn, UUID(instance.image_ref))
    except (ValueError, ImageNotFound):
        return None


def snapshot_properties(
    instance: Instance, base: Image | None, metadata: dict[str, str] | None
) -> dict[str, Any]:
    """What a snapshot of ``instance`` says of itself, as Nova and Glance give it."""
    properties: dict[str, Any] = dict(instance.image_properties)
    properties.update(
        image_type=snapshots.IMAGE_TYPE,
        instance_uuid=str(instance.uuid),
        base_image_ref=instance.image_ref,
        user_id=instance.user_id,
        owner_id=instance.project_id,
        image_location="snapshot",
        image_state="available",
    )
    if base is not None:
        for key in ("kernel_id", "ramdisk_id", "os_distro", "os_type", "os_command_line"):
            if key in base.properties:
                properties[key] = str(base.properties[key])
    properties.update(metadata or {})
    # The image is known as this server's snapshot by it, whatever the metadata says.
    properties["instance_uuid"] = str(instance.uuid)
    return properties


async def _check_caps(
    compute: ComputeAPI,
    conductor: ConductorAPI,
    pool: asyncpg.Pool,
    instance: Instance,
    down: float,
    *,
    action: str,
) -> None:
    if not await compute.can_send(_METHOD):
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: "
            + await too_old(pool, compute, action, _METHOD, down)
            + "."
        )
    if not await conductor.can_take_action_result(PowerAction.SNAPSHOT):
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: the conductor RPC version is "
            f"capped at {await conductor.client.cap()}, and a snapshot needs "
            f"{ACTION_RESULT_SINCE[PowerAction.SNAPSHOT]}. Upgrade every keel-conductor first."
        )


async def create_image(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    version: APIVersion,
    links: Links,
    instance: Instance,
    value: Any,
) -> Response:
    """Check, record, cast; the 202 answer (see the module docstring)."""
    request = parse(value)
    return await take_snapshot(
        pool,
        compute,
        conductor,
        settings=settings,
        ctx=ctx,
        version=version,
        links=links,
        instance=instance,
        image=SnapshotImage(name=request.name, metadata=request.metadata),
    )


class SnapshotImage(BaseModel):
    """What an image made from a server is: its name, the request's metadata, and what
    the action says of it over that (a backup's ``image_type`` and ``backup_type``)."""

    name: str
    metadata: dict[str, str] | None = None
    #: Properties over the metadata.
    over: dict[str, str] = {}
    #: The instance action recorded (``createImage``, ``createBackup``).
    action: str = ACTION
    #: A backup's rotation (kept in the image's row, for when it is whole).
    rotation: int | None = None


async def take_snapshot(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    version: APIVersion,
    links: Links,
    instance: Instance,
    image: SnapshotImage,
) -> Response:
    """Check, record and cast a snapshot of ``instance`` into a new ``image``; the 202
    answer (see the module docstring)."""
    action = image.action
    down = settings.service_down_time
    if instance.vm_state not in snapshots.SNAPSHOTTABLE or instance.task_state is not None:
        raise state_conflict(instance, action)
    secret = settings.images.url_secret
    if secret is None:
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: this deployment signs no image "
            "URLs (KEEL_IMAGES__URL_SECRET is unset), so no agent can write a snapshot."
        )
    await _check_caps(compute, conductor, pool, instance, down, action=action)
    service = await host_service(pool, instance, down)
    if service is None or not service.is_up:
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: the compute service of its host "
            f"{instance.host} is {'gone' if service is None else 'down'}."
        )
    async with pool.acquire() as conn:
        base = await _base_image(conn, instance)
        limits = await project_limits(conn, instance.project_id, settings.quota)
    properties = snapshot_properties(instance, base, image.metadata)
    properties.update(image.over)
    check_metadata_items(limits, len(properties))
    disk_format = base.disk_format if base and base.disk_format in DISK_FORMATS else "qcow2"
    image_id = uuid.uuid4()

    async def begin(conn: Connection) -> bool:
        begun = await snapshots.begin(
            conn,
            instance.uuid,
            image_id=image_id,
            name=image.name,
            owner=instance.project_id,
            disk_format=disk_format,
            min_disk=max(instance.flavor.root_gb, base.min_disk if base else 0),
            min_ram=base.min_ram if base else 0,
            properties=properties,
            backup_rotation=image.rotation,
        )
        if begun is not None:
            await instance_actions.start(conn, ctx, instance.uuid, action)
        return begun is not None

    # A snapshot whose commit lost its answer is withdrawn before the 503: its queued
    # image and task would stand, answered 503, until the deadline killed the image.
    begun = await publish.record(
        pool,
        begin,
        what=f"starting a snapshot of {instance.uuid}",
        withdraw=_withdrawing(
            ctx,
            instance.uuid,
            "the connection to the database was lost as the snapshot was recorded",
        ),
        instance_uuid=instance.uuid,
        request_id=ctx.request_id,
    )
    if not begun:
        raise state_conflict(instance, action)
    ttl = max(settings.images.url_ttl, settings.task_timeout)
    req = SnapshotInstance(
        instance_uuid=instance.uuid,
        image_id=image_id,
        disk_format=disk_format,
        upload_url=image_urls.signed_upload_url(settings.image_download_url, secret, image_id, ttl),
    )
    await _send(
        pool, compute, ctx, instance, service=(service.uuid, service.host), req=req, action=action
    )
    LOG.info(
        "asked compute service %s on %s for a snapshot of server %s into image %s (%s)",
        service.uuid,
        service.host,
        instance.uuid,
        image_id,
        image.name,
        extra={"instance_uuid": str(instance.uuid), "decision": "snapshot_sent"},
    )
    if version.at_least(BODY_SINCE):
        return JSONResponse({"image_id": str(image_id)}, status_code=202)
    location = links.bookmark("image", "v2", "images", str(image_id))
    return Response(status_code=202, headers={"Location": location})


async def _send(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    ctx: RequestContext,
    instance: Instance,
    *,
    service: tuple[UUID, str],
    req: SnapshotInstance,
    action: str,
) -> None:
    """Cast the snapshot to ``service`` (its uuid and host); withdraw it (task cleared,
    image killed) if it cannot be confirmed sent and no agent took it."""
    service_uuid, host = service
    try:
        failed = await publish.send(
            lambda: compute.snapshot_instance(ctx, service_uuid, req),
            what=f"the snapshot of server {instance.uuid}",
        )
    except Unroutable:
        await _withdraw(pool, ctx, instance.uuid, f"no queue for compute service {service_uuid}")
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: the compute service of host {host} "
            "has no queue on the message bus; is its agent running?"
        ) from None
    if failed is None:
        return
    if await _withdraw(pool, ctx, instance.uuid, failed.message):
        raise ServiceUnavailable(
            f"The server was not changed and no image made: the message bus could not be "
            f"reached ({failed.message}). Retry once RabbitMQ is available."
        )
    LOG.warning(
        "the snapshot of server %s could not be confirmed sent (%s), but its agent already took it",
        instance.uuid,
        failed.message,
        extra={"instance_uuid": str(instance.uuid)},
    )


async def _withdraw(pool: asyncpg.Pool, ctx: RequestContext, instance_uuid: UUID, why: str) -> bool:
    return await publish.withdraw(
        pool,
        _withdrawing(ctx, instance_uuid, why),
        what=f"withdrawing the snapshot of {instance_uuid}",
    )


def _withdrawing(
    ctx: RequestContext, instance_uuid: UUID, why: str
) -> Callable[[Connection], Awaitable[bool]]:
    """The transaction's work of :func:`_withdraw`."""

    async def withdraw(conn: Connection) -> bool:
        async def undo() -> bool:
            return await snapshots.withdraw(conn, instance_uuid)

        return await instance_actions.withdraw_untaken(
            conn, instance_uuid, ctx.request_id, why, undo
        )

    return withdraw
