"""``shelve``, ``shelveOffload`` and ``unshelve`` (``POST /servers/{id}/action``), as Nova.

* ``{"shelve": null}`` — the owner or an admin; the server ACTIVE, SHUTOFF, PAUSED or
  SUSPENDED with no task (409 otherwise; a locked server is a 409 unless the caller is an
  admin). keel-api records, in one transaction, the task ``shelving``, the image
  ``<name>-shelved`` (queued, as a snapshot's: :mod:`services.api.servers.snapshot`) and
  its id in the server's system metadata, then casts ``shelve_instance`` (compute RPC
  1.17) to the server's agent with a signed upload URL: the agent powers the guest off,
  writes its disk into the image and reports ``shelve`` to the conductor
  (:mod:`services.conductor.shelving`), which makes the server SHELVED — and, with
  ``KEEL_SHELVED_OFFLOAD_TIME`` = 0, offloads it at once: SHELVED_OFFLOADED, its guest
  destroyed, its claim released, no host.
* ``{"shelveOffload": null}`` — admins (policy ``os_compute_api:os-shelve:shelve_offload``);
  only from SHELVED with no task (409 otherwise): task ``shelving_offloading``, the copy
  token replaced in the same transaction, then the agent destroys the guest.
* ``{"unshelve": null}`` — the owner or an admin. From SHELVED, the guest is powered on
  where it is (task ``unshelving``, then ACTIVE). From SHELVED_OFFLOADED, the conductor
  schedules it again as a build (``unshelve_instance``, conductor RPC 1.18) and builds it
  from the shelved image with a new copy token; ACTIVE, then the shelved image is deleted.
  From 2.77 the value may be ``{"availability_zone": "az"}`` (an offloaded server only:
  409 otherwise; 400 for a zone with no enabled host), from 2.91 also ``{"host": "h"}``
  (policy ``os_compute_api:os-shelve:unshelve_to_host``, admins; 400 for an unknown host
  or one outside the zone) and ``"availability_zone": null`` (the server no longer pinned
  to a zone). A zone given pins the server to it for later moves, as Nova does.

Refused with 409, nothing changed: the server's compute service is down (shelve,
unshelve of a SHELVED server), the deployment signs no image URLs, or the RPC caps are
below what shelve needs (naming the services too old). A shelve whose message cannot be
confirmed sent is withdrawn (503), as a snapshot is; so is an unshelve of an offloaded
server the conductors cannot be sent.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any
from uuid import UUID

import asyncpg

from services.api.http.faults import BadRequest, ConflictingRequest, ServiceUnavailable
from services.api.http.microversion import APIVersion
from services.api.http.policy import SHELVE_OFFLOAD as OFFLOAD_POLICY
from services.api.http.policy import UNSHELVE_TO_HOST as UNSHELVE_TO_HOST_POLICY
from services.api.http.policy import Policy
from services.api.servers import publish
from services.api.servers.lookup import host_service
from services.api.servers.power import PowerAction, run_power_action, state_conflict, too_old
from services.api.servers.snapshot import DISK_FORMATS, snapshot_properties
from services.compute.rpcapi import ComputeAPI, ShelveInstance
from services.conductor.rpcapi import SHELVE_VERSION, ConductorAPI
from services.conductor.rpcapi import PowerAction as ResultAction
from services.conductor.shelving import send_offload
from shared import image_urls
from shared.config import Settings
from shared.context import RequestContext
from shared.db import compute_nodes, images, instance_actions, request_specs, shelves
from shared.db.pool import Connection
from shared.db.transaction import in_transaction
from shared.exceptions import ImageNotFound, MessagingError, Unroutable
from shared.objects.image import Image
from shared.objects.instance import Instance, RequestedDestination
from shared.objects.states import TaskState, VmState

LOG = logging.getLogger(__name__)

SHELVE = "shelve"
SHELVE_OFFLOAD = "shelveOffload"
UNSHELVE = "unshelve"

#: The microversions that give unshelve a zone, then a host (and a zone of null).
ZONE_SINCE = "2.77"
HOST_SINCE = "2.91"

#: Unshelving a SHELVED server: its guest powered on where it is.
UNSHELVE_IN_PLACE = PowerAction(
    UNSHELVE,
    "unshelve_instance",
    TaskState.UNSHELVING,
    (VmState.SHELVED,),
    result=ResultAction.UNSHELVE,
)


def _no_value(action: str, value: Any) -> None:
    if value is not None and value != {}:
        raise BadRequest(f"Invalid input for field/attribute {action}: it must be null.")


async def _check_caps(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    action: str,
    method: str,
    instance: Instance,
    down: float,
) -> None:
    if not await compute.can_send(method):
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: "
            + await too_old(pool, compute, action, method, down)
            + "."
        )
    if not await conductor.can_unshelve():
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: the conductor RPC version is "
            f"capped at {await conductor.client.cap()}, and shelving needs {SHELVE_VERSION}. "
            "Upgrade every keel-conductor first."
        )


async def _base_image(conn: Connection, instance: Instance) -> Image | None:
    try:
        return await images.get(conn, UUID(instance.image_ref))
    except (ValueError, ImageNotFound):
        return None


# --- shelve ----------------------------------------------------------------------------


async def shelve(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    instance: Instance,
    value: Any,
) -> None:
    """Check, record, cast (see the module docstring)."""
    _no_value(SHELVE, value)
    down = settings.service_down_time
    if instance.vm_state not in shelves.SHELVABLE or instance.task_state is not None:
        raise state_conflict(instance, SHELVE)
    secret = settings.images.url_secret
    if secret is None:
        raise ConflictingRequest(
            f"Cannot '{SHELVE}' instance {instance.uuid}: this deployment signs no image "
            "URLs (KEEL_IMAGES__URL_SECRET is unset), so no agent can write a shelved image."
        )
    await _check_caps(
        pool,
        compute,
        conductor,
        action=SHELVE,
        method="shelve_instance",
        instance=instance,
        down=down,
    )
    service = await host_service(pool, instance, down)
    if service is None or not service.is_up:
        raise ConflictingRequest(
            f"Cannot '{SHELVE}' instance {instance.uuid}: the compute service of its host "
            f"{instance.host} is {'gone' if service is None else 'down'}."
        )
    async with pool.acquire() as conn:
        base = await _base_image(conn, instance)
    properties = snapshot_properties(instance, base, None)
    disk_format = base.disk_format if base and base.disk_format in DISK_FORMATS else "qcow2"
    image_id = uuid.uuid4()

    async def begin(conn: Connection) -> bool:
        begun = await shelves.begin(
            conn,
            instance.uuid,
            image_id=image_id,
            name=shelves.image_name(instance),
            owner=instance.project_id,
            disk_format=disk_format,
            min_disk=max(instance.flavor.root_gb, base.min_disk if base else 0),
            min_ram=base.min_ram if base else 0,
            properties=properties,
        )
        if begun is not None:
            await instance_actions.start(conn, ctx, instance.uuid, SHELVE)
        return begun is not None

    if not await in_transaction(pool, begin, what=f"starting a shelve of {instance.uuid}"):
        raise state_conflict(instance, SHELVE)
    ttl = max(settings.images.url_ttl, settings.task_timeout)
    req = ShelveInstance(
        instance_uuid=instance.uuid,
        image_id=image_id,
        disk_format=disk_format,
        upload_url=image_urls.signed_upload_url(settings.image_download_url, secret, image_id, ttl),
    )
    try:
        failed = await publish.send(
            lambda: compute.shelve_instance(ctx, service.uuid, req),
            what=f"the shelve of server {instance.uuid}",
        )
    except Unroutable:
        await _withdraw_shelve(pool, ctx, instance.uuid, f"no queue for {service.uuid}")
        raise ConflictingRequest(
            f"Cannot '{SHELVE}' instance {instance.uuid}: the compute service of host "
            f"{service.host} has no queue on the message bus; is its agent running?"
        ) from None
    if failed is not None and await _withdraw_shelve(pool, ctx, instance.uuid, failed.message):
        raise ServiceUnavailable(
            f"The server was not shelved: the message bus could not be reached "
            f"({failed.message}). Retry once RabbitMQ is available."
        )
    LOG.info(
        "asked compute service %s on %s to shelve server %s into image %s",
        service.uuid,
        service.host,
        instance.uuid,
        image_id,
        extra={"instance_uuid": str(instance.uuid), "decision": "shelve_sent"},
    )


async def _withdraw_shelve(
    pool: asyncpg.Pool, ctx: RequestContext, instance_uuid: UUID, why: str
) -> bool:
    async def withdraw(conn: Connection) -> bool:
        async def undo() -> bool:
            return await shelves.withdraw(conn, instance_uuid)

        return await instance_actions.withdraw_untaken(
            conn, instance_uuid, ctx.request_id, why, undo
        )

    return await publish.withdraw(pool, withdraw, what=f"withdrawing the shelve of {instance_uuid}")


# --- shelveOffload ---------------------------------------------------------------------


async def shelve_offload(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    policy: Policy,
    ctx: RequestContext,
    instance: Instance,
    value: Any,
) -> None:
    """SHELVED → offloading; the agent destroys the guest (the module docstring)."""
    policy.enforce(OFFLOAD_POLICY, ctx)
    _no_value(SHELVE_OFFLOAD, value)
    down = settings.service_down_time
    if instance.vm_state != VmState.SHELVED or instance.task_state is not None:
        raise state_conflict(instance, SHELVE_OFFLOAD)
    await _check_caps(
        pool,
        compute,
        conductor,
        action=SHELVE_OFFLOAD,
        method="shelve_offload_instance",
        instance=instance,
        down=down,
    )

    async def begin(conn: Connection) -> Instance | None:
        begun = await shelves.begin_offload(conn, instance.uuid)
        if begun is not None:
            await instance_actions.start(conn, ctx, instance.uuid, SHELVE_OFFLOAD)
        return begun

    begun = await in_transaction(pool, begin, what=f"starting the offload of {instance.uuid}")
    if begun is None:
        raise state_conflict(instance, SHELVE_OFFLOAD)
    # The server has no current copy from here on: the offload is never withdrawn. A
    # message that cannot be sent leaves it to the conductors' deadline, which completes it.
    await send_offload(pool, compute, ctx, begun, down)


# --- unshelve --------------------------------------------------------------------------

_UNSET: Any = object()


def _parse_unshelve(value: Any, version: APIVersion) -> tuple[Any, str | None]:
    """The zone asked for (``_UNSET``: none named; ``None``: unpin, 2.91) and the host."""
    if value is None:
        return _UNSET, None
    if not version.at_least(ZONE_SINCE) or not isinstance(value, dict):
        since = f", or an object from microversion {ZONE_SINCE}" if isinstance(value, dict) else ""
        raise BadRequest(f"Invalid input for field/attribute unshelve: it must be null{since}.")
    allowed = {"availability_zone"}
    if version.at_least(HOST_SINCE):
        allowed.add("host")
    extra = sorted(set(value) - allowed)
    if extra:
        raise BadRequest(
            "Invalid input for field/attribute unshelve. Additional properties are not "
            f"allowed ({', '.join(map(repr, extra))} unexpected)."
        )
    if not value:
        raise BadRequest("Invalid input for field/attribute unshelve: {} is too short.")
    zone = value.get("availability_zone", _UNSET)
    if zone is None and not version.at_least(HOST_SINCE):
        raise BadRequest(
            "Invalid input for field/attribute availability_zone: None is not of type "
            f"'string' (null from microversion {HOST_SINCE})."
        )
    if (
        zone is not _UNSET
        and zone is not None
        and (not isinstance(zone, str) or not 1 <= len(zone) <= 255)
    ):
        raise BadRequest(
            "Invalid input for field/attribute availability_zone: it must be a string of "
            "1 to 255 characters."
        )
    host = value.get("host")
    if "host" in value and (not isinstance(host, str) or not 1 <= len(host) <= 255):
        raise BadRequest(
            "Invalid input for field/attribute host: it must be a string of 1 to 255 characters."
        )
    return zone, host


async def unshelve(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    policy: Policy,
    version: APIVersion,
    ctx: RequestContext,
    instance: Instance,
    value: Any,
) -> None:
    """Power on where it is, or schedule again (the module docstring)."""
    zone, host = _parse_unshelve(value, version)
    if host is not None:
        policy.enforce(UNSHELVE_TO_HOST_POLICY, ctx)
    if instance.vm_state == VmState.SHELVED and instance.task_state is None:
        if zone is not _UNSET or host is not None:
            raise ConflictingRequest(
                f"The availability_zone or host may be given only to unshelve a shelved "
                f"offloaded server; instance {instance.uuid} is in vm_state shelved."
            )
        await _check_caps(
            pool,
            compute,
            conductor,
            action=UNSHELVE,
            method="unshelve_instance",
            instance=instance,
            down=settings.service_down_time,
        )
        await run_power_action(
            pool,
            compute,
            settings=settings,
            ctx=ctx,
            instance=instance,
            action=UNSHELVE_IN_PLACE,
            conductor=conductor,
        )
        return
    if instance.vm_state != VmState.SHELVED_OFFLOADED or instance.task_state is not None:
        raise state_conflict(instance, UNSHELVE)
    if not await conductor.can_unshelve():
        raise ConflictingRequest(
            f"Cannot '{UNSHELVE}' instance {instance.uuid}: the conductor RPC version is "
            f"capped at {await conductor.client.cap()}, and unshelving needs "
            f"{SHELVE_VERSION}. Upgrade every keel-conductor first."
        )
    destination = await _destination(pool, instance, zone, host)
    await _unshelve_offloaded(pool, conductor, ctx, instance, zone=zone, destination=destination)


async def _destination(
    pool: asyncpg.Pool, instance: Instance, zone: Any, host: str | None
) -> RequestedDestination | None:
    """Check the zone and host asked for; the host as a requested destination."""
    async with pool.acquire() as conn:
        if isinstance(zone, str) and zone not in await compute_nodes.availability_zones(conn):
            raise BadRequest(f"The requested availability zone {zone!r} is not available.")
        if host is None:
            return None
        nodes = await compute_nodes.named(conn, host=host, node=None)
        if not nodes:
            raise BadRequest(f"Compute host {host} could not be found.")
        if zone is _UNSET:
            _, pinned = await request_specs.lock_pinned_zone(conn, instance.uuid)
        else:
            pinned = zone
    if pinned is not None and all(node.availability_zone != pinned for node in nodes):
        raise BadRequest(f"Host {host!r} is not in availability zone {pinned!r}.")
    return RequestedDestination(host=host, node_ids=[node.id for node in nodes])


async def _unshelve_offloaded(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    ctx: RequestContext,
    instance: Instance,
    *,
    zone: Any,
    destination: RequestedDestination | None,
) -> None:
    token = uuid.uuid4()

    async def begin(conn: Connection) -> bool:
        begun = await shelves.begin_unshelve(conn, instance.uuid, token)
        if begun is None:
            return False
        if zone is not _UNSET:
            await request_specs.set_pinned_zone(conn, instance.uuid, zone)
        await instance_actions.start(conn, ctx, instance.uuid, UNSHELVE)
        return True

    if not await in_transaction(pool, begin, what=f"starting the unshelve of {instance.uuid}"):
        raise state_conflict(instance, UNSHELVE)
    failed: MessagingError | None
    try:
        failed = await publish.send(
            lambda: conductor.unshelve_instance(ctx, instance.uuid, destination),
            what=f"the unshelve of server {instance.uuid}",
        )
    except Unroutable as exc:
        failed = exc
    if failed is not None:
        why = failed.message

        async def withdraw(conn: Connection) -> bool:
            if not await shelves.withdraw_unshelve(conn, instance.uuid):
                return False
            await instance_actions.withdraw(conn, instance.uuid, ctx.request_id, why)
            return True

        if await publish.withdraw(pool, withdraw, what=f"withdrawing unshelve of {instance.uuid}"):
            raise ServiceUnavailable(
                f"The server was not unshelved: keel-conductor could not be reached "
                f"({why}). Retry once it is available."
            )
    LOG.info(
        "unshelve of offloaded server %s accepted%s",
        instance.uuid,
        f" (to host {destination.host})" if destination else "",
        extra={"instance_uuid": str(instance.uuid), "decision": "unshelve_accepted"},
    )
