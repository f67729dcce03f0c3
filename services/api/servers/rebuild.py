"""``POST /servers/{id}/action {"rebuild": {"imageRef": ...}}``: the server made again from
an image, on its own host.

As in Nova: the server must be ACTIVE, SHUTOFF or ERROR with no task (409 otherwise),
not locked (409, unless the caller is an admin), and the image usable and fit for the
server's flavor (400). The request may also rename the server, replace its metadata,
set its access addresses and admin password, from 2.19 its description, from 2.54 its
key pair (``null`` removes it), from 2.57 its user data (``null`` removes it) and from
2.90 its host name (fully qualified from 2.94); a field the request's microversion does
not have is a 400. The server keeps the new image's properties (shown from 2.98).

keel-api writes the new image and fields with the task ``rebuild_spawning`` (status
REBUILD) in one compare-and-swap, and casts ``rebuild_guest`` (compute RPC 1.12) to the
server's agent with everything it needs to make the guest again: the agent removes the
old guest, makes the new one from the image with the server's addresses and config
drive, leaves it shut down if the server was SHUTOFF, and reports to the conductor
(``instance_action_result``, conductor RPC 1.14): SHUTOFF stays SHUTOFF, ACTIVE and
ERROR become ACTIVE; a failure is ERROR with the reason as the fault, and so is a rebuild
no agent finished within ``KEEL_TASK_TIMEOUT``. The agent takes the request only while
that rebuild is under way on its node, so a message delivered again after it ended
does nothing.

Refused with 409, nothing changed: the server's compute service is down or has no
queue, the deployment's RPC cap is below what a rebuild needs (naming the services
too old), or a move that ended unfinished may have left a running copy elsewhere. If
the message cannot be confirmed sent and no agent took it, the task and every field are
put back as they were and the answer is 503.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal
from uuid import UUID

import asyncpg
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.api.http.faults import BadRequest, ConflictingRequest, ServiceUnavailable
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.servers import publish
from services.api.servers.create import check_fits, usable_image
from services.api.servers.fields import (
    AccessIPv4,
    AccessIPv6,
    Description,
    Metadata,
    ServerName,
    UserData,
    new_password,
    unexpected,
)
from services.api.servers.hostname import checked_hostname
from services.api.servers.keys import find_key
from services.api.servers.lookup import host_service, server_view
from services.api.servers.power import (
    refuse_while_a_stray_copy_may_run,
    state_conflict,
    too_old,
)
from services.api.servers.views import ServerView
from services.compute.rpcapi import ComputeAPI, InstanceSpec
from services.conductor.boot_images import BootImages
from services.conductor.guest_data import instance_spec
from services.conductor.rpcapi import ACTION_RESULT_SINCE, ConductorAPI, PowerAction
from shared import image_properties
from shared.config import Settings
from shared.context import RequestContext
from shared.db import fixed_ips, instance_actions, rebuilds
from shared.db.pool import Connection
from shared.db.rebuilds import RebuildChange
from shared.exceptions import BuildFailed, Unroutable
from shared.objects.instance import Instance
from shared.objects.states import VmState

LOG = logging.getLogger(__name__)

ACTION = "rebuild"
_METHOD = "rebuild_guest"

#: Fields a microversion added to the rebuild body, and since when.
_SINCE = {
    "description": "2.19",
    "key_name": "2.54",
    "user_data": "2.57",
    "trusted_image_certificates": "2.63",
}


class RebuildRequest(BaseModel):
    """The ``rebuild`` value, as Nova's schema has it (anything else is a 400)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    image_ref: str = Field(alias="imageRef", min_length=1, max_length=2048)
    name: ServerName | None = None
    admin_pass: str | None = Field(default=None, alias="adminPass")
    metadata: Metadata | None = None
    preserve_ephemeral: bool = False
    disk_config: Literal["AUTO", "MANUAL"] | None = Field(default=None, alias="OS-DCF:diskConfig")
    access_ip_v4: AccessIPv4 = Field(default=None, alias="accessIPv4")
    access_ip_v6: AccessIPv6 = Field(default=None, alias="accessIPv6")
    personality: list[Any] | None = None
    description: Description = None
    key_name: str | None = Field(default=None, min_length=1, max_length=255)
    user_data: UserData = None
    trusted_image_certificates: list[Any] | None = None
    #: Checked by :func:`~services.api.servers.hostname.checked_hostname` (2.90, 2.94).
    hostname: Any = None


def parse(value: Any, version: APIVersion) -> RebuildRequest:
    """The request's ``rebuild`` value, checked against its microversion (400 if wrong)."""
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute rebuild: it must be an object.")
    try:
        request = RebuildRequest.model_validate(value)
    except ValidationError as exc:
        errors = [{**error, "loc": ("rebuild", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None
    given = request.model_fields_set
    for name, since in _SINCE.items():
        if name in given and not version.at_least(since):
            raise unexpected(name, since)
    if "personality" in given:
        if version.at_least("2.57"):
            raise BadRequest(
                "Invalid input for field/attribute rebuild. Additional properties are not "
                "allowed ('personality' was unexpected): it was removed in microversion 2.57."
            )
        if request.personality:
            raise BadRequest(
                "keel does not inject files into guests (personality); pass them in "
                "user_data instead."
            )
    if request.trusted_image_certificates:
        raise BadRequest(
            "keel does not verify image signatures: trusted_image_certificates must be "
            "empty or null."
        )
    if "hostname" in given:
        request.hostname = checked_hostname(request.hostname, version, where="rebuild")
    if request.preserve_ephemeral:
        raise BadRequest(
            "keel's drivers do not keep ephemeral disks across a rebuild: "
            "preserve_ephemeral must be false."
        )
    return request


async def _change(
    conn: Connection, ctx: RequestContext, instance: Instance, request: RebuildRequest
) -> RebuildChange:
    """What the rebuild writes: the image (checked for this caller and the flavor) and the
    fields the request gives."""
    image = await usable_image(conn, request.image_ref, ctx)
    check_fits(instance.flavor, image)
    given = request.model_fields_set
    fields: dict[str, Any] = {}
    if request.name is not None:
        fields["display_name"] = request.name
    if request.metadata is not None:
        fields["metadata"] = dict(request.metadata)
    if "description" in given:
        fields["description"] = request.description
    if request.access_ip_v4 is not None:
        fields["access_ip_v4"] = request.access_ip_v4
    if request.access_ip_v6 is not None:
        fields["access_ip_v6"] = request.access_ip_v6
    if "key_name" in given:
        key = await find_key(conn, ctx, request.key_name)
        fields["key_name"] = None if key is None else key.name
        fields["key_data"] = None if key is None else key.public_key
    if "user_data" in given:
        fields["user_data"] = request.user_data
    if "hostname" in given:
        fields["hostname"] = request.hostname
    return RebuildChange(
        image_ref=str(image.id),
        image_properties=image_properties.kept(image.properties),
        given=frozenset(fields),
        **fields,
    )


async def _check_caps(
    compute: ComputeAPI,
    conductor: ConductorAPI,
    pool: asyncpg.Pool,
    instance: Instance,
    down_time: float,
) -> None:
    """409 while the RPC caps are below what a rebuild needs, naming what is too old."""
    if not await compute.can_send(_METHOD):
        raise ConflictingRequest(
            f"Cannot '{ACTION}' instance {instance.uuid}: "
            + await too_old(pool, compute, ACTION, _METHOD, down_time)
            + "."
        )
    if not await conductor.can_take_action_result(PowerAction.REBUILD):
        raise ConflictingRequest(
            f"Cannot '{ACTION}' instance {instance.uuid}: the conductor RPC version is "
            f"capped at {await conductor.client.cap()}, and a rebuild needs "
            f"{ACTION_RESULT_SINCE[PowerAction.REBUILD]}. Upgrade every keel-conductor first."
        )


async def rebuild(
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
) -> dict[str, Any]:
    """Check, record, cast; the answer's body (see the module docstring)."""
    request = parse(value, version)
    down_time = settings.service_down_time
    await _check_caps(compute, conductor, pool, instance, down_time)
    if instance.vm_state not in rebuilds.REBUILDABLE or instance.task_state is not None:
        raise state_conflict(instance, ACTION)
    service = await host_service(pool, instance, down_time)
    if not instance.host:
        raise ConflictingRequest(
            f"Cannot '{ACTION}' instance {instance.uuid}: it was never placed on a compute host."
        )
    if service is None or not service.is_up:
        raise ConflictingRequest(
            f"Cannot '{ACTION}' instance {instance.uuid}: the compute service of its host "
            f"{instance.host} is {'gone' if service is None else 'down'}; evacuate it instead."
        )
    await refuse_while_a_stray_copy_may_run(
        pool, instance, ACTION, down_time, settings.fencing.margin
    )
    async with pool.acquire() as conn:
        change = await _change(conn, ctx, instance, request)
        try:
            boot = await BootImages.from_settings(settings).source(conn, change.image_ref)
        except BuildFailed as exc:
            raise BadRequest(
                f"Cannot rebuild from image {change.image_ref}: {exc.message}"
            ) from None
        addresses = await fixed_ips.for_instance(conn, instance.uuid)

    async def begin(conn: Connection) -> tuple[Instance, Instance, ServerView] | None:
        begun = await rebuilds.begin(conn, instance.uuid, change)
        if begun is None:
            return None
        await instance_actions.start(conn, ctx, instance.uuid, ACTION)
        # The answer is read with the change: a rebuild sent, or standing because the
        # database went away before it could be withdrawn, is answered without it.
        view = await server_view(
            conn,
            ctx,
            version,
            links,
            down_time,
            shown=[begun[1]],
            forward_name=settings.network.forward_name,
        )
        return (*begun, view)

    try:
        # A rebuild whose commit lost its answer is withdrawn before the 503: it would
        # stand, its new fields kept and its task left to the deadline (ERROR).
        begun = await publish.record(
            pool,
            begin,
            what=f"starting the rebuild of {instance.uuid}",
            withdraw=_withdrawing(
                ctx,
                instance,
                change,
                "the connection to the database was lost as the rebuild was recorded",
            ),
            instance_uuid=instance.uuid,
            request_id=ctx.request_id,
        )
    except rebuilds.Unclaimed:
        raise ConflictingRequest(
            f"Cannot '{ACTION}' instance {instance.uuid}: it holds no claim on its host "
            f"{instance.host} (its build never succeeded there), so no guest of it may be "
            "made there. Delete it and create it again."
        ) from None
    if begun is None:
        raise state_conflict(instance, ACTION)
    before, after, view = begun
    spec = instance_spec(after, instance.node or "", list(addresses), boot, origin=after.copy_token)
    powered_off = before.vm_state == VmState.STOPPED
    await _send(
        pool,
        compute,
        ctx,
        before=before,
        change=change,
        service_uuid=service.uuid,
        host=service.host,
        spec=spec,
        powered_off=powered_off,
    )
    body = view.rebuilt(after)
    body["adminPass"] = request.admin_pass if request.admin_pass is not None else new_password()
    return {"server": body}


async def _send(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    ctx: RequestContext,
    *,
    before: Instance,
    change: RebuildChange,
    service_uuid: UUID,
    host: str,
    spec: InstanceSpec,
    powered_off: bool,
) -> None:
    """Cast the rebuild; withdraw it (every field back) if it cannot be confirmed sent."""
    try:
        failed = await publish.send(
            lambda: compute.rebuild_guest(ctx, service_uuid, spec, powered_off=powered_off),
            what=f"the rebuild of server {before.uuid}",
        )
    except Unroutable:
        await _withdraw(pool, ctx, before, change, f"no queue for compute service {service_uuid}")
        raise ConflictingRequest(
            f"Cannot '{ACTION}' instance {before.uuid}: the compute service of host {host} "
            "has no queue on the message bus; is its agent running?"
        ) from None
    if failed is not None:
        if await _withdraw(pool, ctx, before, change, failed.message):
            raise ServiceUnavailable(
                f"The server was not changed: the message bus could not be reached "
                f"({failed.message}). Retry once RabbitMQ is available."
            )
        LOG.warning(
            "the rebuild of server %s could not be confirmed sent (%s), but its agent "
            "already took it",
            before.uuid,
            failed.message,
            extra={"instance_uuid": str(before.uuid)},
        )
        return
    LOG.info(
        "asked compute service %s on %s to rebuild server %s from image %s%s",
        service_uuid,
        host,
        before.uuid,
        change.image_ref,
        " (it stays shut off)" if powered_off else "",
        extra={"instance_uuid": str(before.uuid), "decision": "rebuild_sent"},
    )


async def _withdraw(
    pool: asyncpg.Pool, ctx: RequestContext, before: Instance, change: RebuildChange, why: str
) -> bool:
    """Put the server back as it was, if no agent took the rebuild; False if one did."""
    return await publish.withdraw(
        pool,
        _withdrawing(ctx, before, change, why),
        what=f"withdrawing the rebuild of {before.uuid}",
    )


def _withdrawing(
    ctx: RequestContext, before: Instance, change: RebuildChange, why: str
) -> Callable[[Connection], Awaitable[bool]]:
    """The transaction's work of :func:`_withdraw`."""

    async def withdraw(conn: Connection) -> bool:
        async def undo() -> bool:
            return await rebuilds.withdraw(conn, before, change)

        return await instance_actions.withdraw_untaken(conn, before.uuid, ctx.request_id, why, undo)

    return withdraw
