"""Creating a server: validate the request, record it, hand it to the conductor.

The instance row (BUILD, scheduling) with the fields of
:mod:`services.api.servers.fields` and its fixed address, its request spec and a
``create`` action are written in one transaction, so the new server is readable the
moment the client gets its id. Then ``build_instances`` is cast to keel-conductor,
which schedules and builds.

If that cast cannot be sent (no conductor queue on the broker, or the broker is
unreachable) the request fails with 503 and the server is soft-deleted again, its
action closed with the reason: the client sees a clear error, retries when the
conductor is back, and no half-created server is left for anyone to clean up. A
conductor that still receives the message finds the instance deleted and drops it. If
the database cannot be reached to withdraw it either, the server is accepted (202): the
message may have gone out, so a 503 could not promise that nothing happened; a build no
conductor received ends in ERROR by the build deadline.

The connection to PostgreSQL may also drop while the transaction commits: the client
gets a 503, but the server may have been recorded all the same. Its UUID was chosen
before the transaction, so keel-api withdraws it in the background once the database
answers again (for up to :data:`UNCONFIRMED_WITHIN` seconds): a 503 never leaves a
server behind that nobody will build. Should keel-api stop before it can, the build
deadline fails that server instead.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any
from uuid import UUID

import asyncpg
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, field_validator
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_random_exponential

from services.api.http.bounds import INT4_MAX
from services.api.http.faults import BadRequest, ConflictingRequest, ServiceUnavailable
from services.api.http.microversion import APIVersion
from services.api.http.policy import Policy
from services.api.resources.flavors import may_use
from services.api.servers import group_hint, publish, requested_destination
from services.api.servers import keys as server_keys
from services.api.servers.fields import PreparedFields, ServerFields
from services.api.servers.hostname import checked_hostname
from services.api.servers.lookup import last_segment
from services.api.servers.requested_destination import ZoneRequest, parse_zone
from services.conductor.rpcapi import DESTINATION_VERSION, ConductorAPI
from shared import hostnames, image_properties
from shared.config import QuotaSettings
from shared.context import RequestContext
from shared.db import (
    allocations,
    compute_nodes,
    fixed_ips,
    flavors,
    images,
    instance_actions,
    instances,
    new_servers,
)
from shared.db.errors import describe, is_unavailable
from shared.db.pool import Connection
from shared.db.transaction import in_transaction
from shared.exceptions import FlavorNotFound, ImageNotFound, MessagingError, ServiceTooOld
from shared.objects.flavor import Flavor, FlavorSnapshot
from shared.objects.image import Image
from shared.objects.instance import Instance, RequestedDestination, RequestSpec
from shared.objects.server_group import ServerGroup

LOG = logging.getLogger(__name__)

CREATE_ACTION = "create"
#: Seconds keel-api keeps trying to withdraw a create whose commit went unanswered.
UNCONFIRMED_WITHIN = 600.0
#: The withdrawals running in the background (held so they are not collected).
_unconfirmed: set[asyncio.Task[None]] = set()
#: Host and hypervisor names as Nova's schema accepts them.
HOSTNAME_PATTERN = r"^[a-zA-Z0-9-._]*$"


def _whole_count(value: object) -> object:
    """Nova's positive integer: a JSON integer, or a string of digits."""
    if isinstance(value, bool):
        raise ValueError("must be an integer")
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


Count = Annotated[StrictInt, BeforeValidator(_whole_count), Field(ge=1, le=INT4_MAX)]


@dataclass(frozen=True)
class CreateRequest:
    """What a create request asks for beyond its body, decided before anything is written."""

    zone: str | None
    destination: RequestedDestination | None
    group: ServerGroup | None = None


class NewServer(ServerFields):
    """The fields keel reads; other fields clients send are ignored."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=255)
    image_ref: str = Field(alias="imageRef", max_length=2048)
    flavor_ref: str = Field(alias="flavorRef", min_length=1, max_length=2048)
    #: How many servers (Nova's multiple create): from ``min_count`` (default 1) up to
    #: ``max_count`` (default ``min_count``), as many as the quota has room for.
    min_count: Count | None = None
    max_count: Count | None = None
    #: Answer ``{"reservation_id": ...}`` instead of the (first) server.
    return_reservation_id: bool = False
    availability_zone: str | None = Field(default=None, min_length=1, max_length=255)
    key_name: str | None = Field(default=None, max_length=255)
    #: A config drive for the guest (a boolean, or one of its spellings: "true", "1"...).
    config_drive: bool = False
    #: A requested destination (microversion 2.74, admin): see
    #: :mod:`services.api.servers.requested_destination`.
    host: str | None = Field(default=None, min_length=1, max_length=255, pattern=HOSTNAME_PATTERN)
    hypervisor_hostname: str | None = Field(
        default=None, min_length=1, max_length=255, pattern=HOSTNAME_PATTERN
    )
    #: The guest's host name (microversion 2.90): see :mod:`services.api.servers.hostname`.
    hostname: Any = None

    @field_validator("flavor_ref", mode="before")
    @classmethod
    def _flavor_id_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("name")
    @classmethod
    def _printable_name(cls, value: str) -> str:
        if value != value.strip():
            raise ValueError("must not start or end with whitespace")
        if not value.isprintable():
            raise ValueError("must not contain control characters")
        return value


class NewServerBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    server: NewServer
    #: Scheduler hints: keel reads ``group`` (:mod:`services.api.servers.group_hint`).
    scheduler_hints: dict[str, Any] | None = Field(default=None, alias="os:scheduler_hints")
    legacy_scheduler_hints: dict[str, Any] | None = Field(
        default=None, alias="OS-SCH-HNT:scheduler_hints"
    )

    def hints(self) -> dict[str, Any]:
        return {**(self.legacy_scheduler_hints or {}), **(self.scheduler_hints or {})}


def counts(server: NewServer, fields: PreparedFields) -> tuple[int, int]:
    """``(min_count, max_count)`` as Nova reads them: the maximum defaults to the minimum."""
    least = server.min_count or 1
    most = server.max_count if server.max_count is not None else least
    if least > most:
        raise BadRequest("min_count must be <= max_count")
    if most > 1 and any(wanted.fixed_ip for wanted in fields.addresses):
        raise BadRequest("Unable to launch multiple instances with a single configured fixed IP.")
    return least, most


def kept_hints(hints: dict[str, Any]) -> dict[str, list[str]]:
    """The scheduler hints as a server keeps them, as Nova keeps them: each a list of
    strings (a single value becomes a list of one)."""
    return {
        name: [str(item) for item in (value if isinstance(value, list) else [value])]
        for name, value in hints.items()
    }


def new_reservation_id() -> str:
    """Nova's shape: ``r-`` and eight random characters."""
    return "r-" + uuid.uuid4().hex[:8]


async def _flavor(conn: Connection, ref: str, ctx: RequestContext) -> Flavor:
    """The flavor asked for; a private one only for admins and projects on its access list."""
    flavor_id = last_segment(ref)
    try:
        flavor = await flavors.get(conn, flavor_id)
    except FlavorNotFound:
        raise BadRequest(f"Flavor {flavor_id} could not be found.") from None
    if not await may_use(conn, ctx, flavor):
        raise BadRequest(f"Flavor {flavor_id} could not be found.")
    if flavor.disabled:
        raise BadRequest(f"Flavor {flavor_id} is disabled.")
    return flavor


async def usable_image(conn: Connection, ref: str, ctx: RequestContext) -> Image:
    """The image ``ref`` names, if the caller may boot it and it is active; 400 if not."""
    raw = last_segment(ref)
    try:
        image = await images.get(conn, UUID(raw))
    except (ValueError, ImageNotFound):
        raise BadRequest(f"Image {raw} could not be found.") from None
    visible = ctx.is_admin or image.visibility in ("public", "community")
    if not (visible or image.owner == ctx.project_id):
        raise BadRequest(f"Image {raw} could not be found.")
    if image.status != "active":
        raise BadRequest(f"Image {raw} is not active (status {image.status}).")
    return image


def check_fits(flavor: Flavor | FlavorSnapshot, image: Image) -> None:
    if flavor.memory_mb < image.min_ram:
        raise BadRequest(
            f"Flavor's memory is too small for requested image: "
            f"{flavor.memory_mb} MB < {image.min_ram} MB."
        )
    if flavor.root_gb and flavor.root_gb < image.min_disk:
        raise BadRequest(
            f"Flavor's disk is too small for requested image: "
            f"{flavor.root_gb} GB < {image.min_disk} GB."
        )


async def _check_zone(conn: Connection, zone: ZoneRequest) -> None:
    """A zone named on its own must have enabled hosts; a forced host or node names its
    place precisely, so its zone is taken as given (as Nova does)."""
    if zone.zone is None or zone.forced:
        return
    if zone.zone not in await compute_nodes.availability_zones(conn):
        raise BadRequest(f"The requested availability zone {zone.zone!r} is not available.")


async def _validate(
    conn: Connection,
    ctx: RequestContext,
    server: NewServer,
    *,
    policy: Policy,
    version: APIVersion,
    hints: dict[str, Any],
) -> tuple[Flavor, Image, CreateRequest]:
    zone = parse_zone(server.availability_zone)
    group = await group_hint.find(conn, ctx, group_hint.group_id(hints))
    destination = await requested_destination.resolve(
        conn,
        ctx,
        policy,
        version,
        host=server.host,
        node=server.hypervisor_hostname,
        zone=zone,
    )
    flavor = await _flavor(conn, server.flavor_ref, ctx)
    image = await usable_image(conn, server.image_ref, ctx)
    check_fits(flavor, image)
    await _check_zone(conn, zone)
    if destination is not None:
        await group_hint.check_destination(conn, group, destination.node_ids)
    return flavor, image, CreateRequest(zone=zone.zone, destination=destination, group=group)


@dataclass(frozen=True)
class Batch:
    """The servers one request asks for: how many, and what they share."""

    min_count: int
    max_count: int
    reservation_id: str
    #: The UUIDs chosen before the transaction, one per server it may create.
    uuids: tuple[UUID, ...]
    #: The host name asked for (2.90; one server only), else each is made from its name.
    hostname: str | None = None
    #: The scheduler hints asked with, as each server keeps them (shown from 2.100).
    hints: dict[str, list[str]] = field(default_factory=dict)

    def name(self, base: str, count: int, index: int) -> str:
        """Nova's names: the name as given for one server, ``NAME-1``, ``NAME-2``... else."""
        return base if count == 1 else f"{base}-{index + 1}"

    def hostname_of(self, name: str, instance_uuid: UUID) -> str:
        """The host name the server keeps: the one asked for, or made from its name."""
        return self.hostname or hostnames.from_name(name, instance_uuid)


async def _record(
    conn: Connection,
    ctx: RequestContext,
    server: NewServer,
    flavor: Flavor,
    image: Image,
    *,
    request: CreateRequest,
    fields: PreparedFields,
    quota: QuotaSettings,
    batch: Batch,
) -> list[Instance]:
    """Write each instance, its request spec and its action (inside one transaction):
    all of them or, when anything is refused, none."""
    project_id, user_id = ctx.project_id or "", ctx.user_id or ""
    snapshot = flavor.snapshot()
    # Key pair and quota: checked in the transaction that inserts the servers.
    key = await server_keys.find_key(conn, ctx, server.key_name)
    count = await server_keys.check_quota(
        conn,
        ctx,
        quota,
        snapshot,
        len(server.metadata or {}),
        min_count=batch.min_count,
        max_count=batch.max_count,
    )
    created = []
    for index, instance_uuid in enumerate(batch.uuids[:count]):
        name = batch.name(server.name, count, index)
        new = new_servers.NewServer(
            instance_uuid=instance_uuid,
            project_id=project_id,
            user_id=user_id,
            display_name=name,
            hostname=batch.hostname_of(name, instance_uuid),
            image_properties=image_properties.kept(image.properties),
            flavor=snapshot,
            image_ref=str(image.id),
            availability_zone=request.zone,
            reservation_id=batch.reservation_id,
            launch_index=index,
            config_drive=server.config_drive,
            metadata=fields.metadata,
            description=fields.description,
            tags=fields.tags,
            user_data=fields.user_data,
            access_ip_v4=fields.access_ip_v4,
            access_ip_v6=fields.access_ip_v6,
        )
        spec = RequestSpec(
            instance_uuid=instance_uuid,
            project_id=project_id,
            user_id=user_id,
            flavor=snapshot,
            image_ref=str(image.id),
            availability_zone=request.zone,
        )
        instance = await new_servers.insert(
            conn, new, spec=spec, scheduler_hints=batch.hints, ctx=ctx, action=CREATE_ACTION
        )
        await fields.record(conn, instance.uuid, project_id, ctx.is_admin)
        await server_keys.record_key(conn, instance, key)
        created.append(instance)
    await group_hint.join(conn, request.group, [i.uuid for i in created], quota=quota)
    return created


async def _withdraw(pool: asyncpg.Pool, instance: Instance, reason: str) -> bool:
    """Remove a new server no conductor has placed yet (its quota, addresses and any claim
    go with it); False if one already placed it: then its build goes on."""

    async def withdraw(conn: Connection) -> bool:
        if not await instances.soft_delete_unplaced(conn, instance.uuid):
            return False
        await allocations.release_instance(conn, instance.uuid)
        await fixed_ips.release(conn, instance.uuid)
        await instance_actions.finish(conn, instance.uuid, CREATE_ACTION, reason)
        return True

    return await in_transaction(pool, withdraw, what=f"withdrawing new server {instance.uuid}")


def _unconfirmed_withdrawal(instance_uuid: UUID) -> Callable[[Connection], Awaitable[bool]]:
    """Withdraw the server if its unanswered commit recorded it."""
    reason = (
        "the connection to the database was lost while the server was being recorded; "
        "the request was answered 503"
    )

    async def withdraw(conn: Connection) -> bool:
        if not await instances.soft_delete_unplaced(conn, instance_uuid):
            return False
        await fixed_ips.release(conn, instance_uuid)
        await instance_actions.finish(conn, instance_uuid, CREATE_ACTION, reason)
        return True

    return withdraw


async def _withdraw_now_or_later(pool: asyncpg.Pool, instance_uuid: UUID) -> None:
    """Withdraw at once the server an unanswered commit may have recorded, or, if the
    database cannot be reached now, in the background (see the module docstring)."""
    what = f"withdrawing unconfirmed server {instance_uuid}"
    try:
        withdrawn = await in_transaction(pool, _unconfirmed_withdrawal(instance_uuid), what=what)
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        _withdraw_in_background(pool, instance_uuid)
        return
    _log_unconfirmed(instance_uuid, withdrawn)


async def _withdraw_unconfirmed(pool: asyncpg.Pool, instance_uuid: UUID) -> None:
    """Withdraw the server if its unanswered commit recorded it; see the module docstring."""
    withdraw = _unconfirmed_withdrawal(instance_uuid)

    retrying = AsyncRetrying(
        retry=retry_if_exception(is_unavailable),
        stop=stop_after_delay(UNCONFIRMED_WITHIN),
        wait=wait_random_exponential(multiplier=0.5, max=5.0),
        reraise=True,
    )
    extra = {"instance_uuid": str(instance_uuid), "decision": "unconfirmed_create"}
    try:
        withdrawn: bool = await retrying(
            in_transaction, pool, withdraw, what=f"withdrawing unconfirmed server {instance_uuid}"
        )
    except Exception as exc:
        LOG.error(
            "could not find out within %gs whether new server %s was recorded (%s); if it "
            "was, the build deadline puts it in ERROR",
            UNCONFIRMED_WITHIN,
            instance_uuid,
            describe(exc),
            extra=extra,
        )
        return
    _log_unconfirmed(instance_uuid, withdrawn)


def _log_unconfirmed(instance_uuid: UUID, withdrawn: bool) -> None:
    extra = {"instance_uuid": str(instance_uuid), "decision": "unconfirmed_create"}
    if withdrawn:
        LOG.warning(
            "withdrew new server %s: it was recorded, but the connection to the database "
            "was lost while it was being recorded; the request was answered 503",
            instance_uuid,
            extra=extra,
        )
    else:
        LOG.info("new server %s was not recorded: nothing to withdraw", instance_uuid, extra=extra)


def _withdraw_in_background(pool: asyncpg.Pool, instance_uuid: UUID) -> None:
    task = asyncio.create_task(
        _withdraw_unconfirmed(pool, instance_uuid), name=f"keel-withdraw-{instance_uuid}"
    )
    _unconfirmed.add(task)
    task.add_done_callback(_unconfirmed.discard)


async def create_server(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    ctx: RequestContext,
    server: NewServer,
    *,
    fields: PreparedFields,
    quota: QuotaSettings,
    policy: Policy,
    version: APIVersion,
    hints: dict[str, Any] | None = None,
) -> list[Instance]:
    """Record the servers and ask the conductor to build each; see the module docstring."""
    least, most = counts(server, fields)
    hostname = None
    if "hostname" in server.model_fields_set:
        hostname = checked_hostname(server.hostname, version)
        if most > 1:
            raise BadRequest("Unable to allocate a single hostname to multiple instances")
    async with pool.acquire() as conn:
        flavor, image, request = await _validate(
            conn, ctx, server, policy=policy, version=version, hints=hints or {}
        )
    destination = request.destination
    if destination is not None and not await conductor.can_take_destinations():
        raise _conductor_too_old(await conductor.client.cap())

    batch = Batch(
        least,
        most,
        new_reservation_id(),
        tuple(uuid.uuid4() for _ in range(most)),
        hostname=hostname,
        hints=kept_hints(hints or {}),
    )
    committing = False

    async def record(conn: Connection) -> list[Instance]:
        nonlocal committing
        recorded = await _record(
            conn,
            ctx,
            server,
            flavor,
            image,
            request=request,
            fields=fields,
            quota=quota,
            batch=batch,
        )
        committing = True
        return recorded

    try:
        created = await in_transaction(pool, record, what=f"recording new server {server.name!r}")
    except Exception as exc:
        if committing and is_unavailable(exc):
            # Lost during COMMIT: recorded or not, nobody knows yet. Withdrawn before the
            # answer if the database answers (a dropped connection is replaced at once).
            for instance_uuid in batch.uuids:
                await _withdraw_now_or_later(pool, instance_uuid)
        raise
    for instance in created:
        await _hand_over(pool, conductor, ctx, instance, destination, batch=created)
    LOG.info(
        "%d server(s) of reservation %s (%s) accepted: flavor %s, image %s%s",
        len(created),
        batch.reservation_id,
        ", ".join(str(instance.uuid) for instance in created),
        flavor.flavorid,
        image.id,
        f", requested destination {destination.describe()}" if destination else "",
        extra={"instance_uuid": str(created[0].uuid)},
    )
    return created


async def _hand_over(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    ctx: RequestContext,
    instance: Instance,
    destination: RequestedDestination | None,
    *,
    batch: list[Instance],
) -> None:
    """Cast the build of ``instance``; if it cannot be sent, withdraw every server of the
    request (``batch``: a conductor given one already finds it deleted and drops it), and
    refuse the request."""
    extra: dict[str, Any] = {"instance_uuid": str(instance.uuid)}
    try:
        failed = await publish.send(
            lambda: conductor.build_instances(ctx, instance.uuid, destination),
            what=f"the build of server {instance.uuid}",
        )
    except ServiceTooOld as exc:
        # The cap fell between the check and the cast: nothing was sent.
        for withdrawn in batch:
            await _withdraw(pool, withdrawn, exc.message)
        raise ConflictingRequest(exc.message) from None
    except MessagingError as exc:  # unroutable: no conductor queue, nothing delivered
        failed = exc
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        # The database went away between the attempts (the RPC pins are read from it):
        # an earlier attempt may have gone out.
        _accepted_unsure(instance, f"it could not be sent for certain ({describe(exc)})")
        return
    if failed is not None:
        reason = f"keel-conductor could not be reached: {failed.message}"
        try:
            was_withdrawn = await _withdraw(pool, instance, reason)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            # The message may have gone out, and the server cannot be withdrawn now.
            _accepted_unsure(
                instance,
                f"it could not be confirmed sent ({failed.message}) nor the server "
                f"withdrawn ({describe(exc)})",
            )
            return
        if was_withdrawn:
            # The request is refused: withdraw its other servers too, unless a
            # conductor already placed them (those go on).
            for other in batch:
                if other.uuid != instance.uuid:
                    await _withdraw(pool, other, reason)
            LOG.error("withdrew new server %s: %s", instance.uuid, reason, extra=extra)
            raise ServiceUnavailable(
                f"The server was not created: {reason}. Check that keel-conductor and "
                "RabbitMQ are running, then retry."
            )
        LOG.warning(
            "the build of server %s could not be confirmed sent (%s), but a conductor has "
            "already taken it: it goes on",
            instance.uuid,
            failed.message,
            extra=extra,
        )


def _accepted_unsure(instance: Instance, why: str) -> None:
    """The server is recorded and its build may have gone out: a 503 would say nothing
    happened, so it is accepted; built if a conductor got the message, else put in ERROR
    by the build deadline."""
    LOG.warning(
        "the build of server %s: %s; the server is accepted: its build goes on if a "
        "conductor got it, else the build deadline puts it in ERROR",
        instance.uuid,
        why,
        extra={"instance_uuid": str(instance.uuid), "decision": "create_accepted_unsure"},
    )


def _conductor_too_old(cap: str) -> ConflictingRequest:
    return ConflictingRequest(
        f"Cannot create a server on a requested destination: the conductor RPC version is "
        f"capped at {cap} and a requested destination needs {DESTINATION_VERSION}. Upgrade "
        "every keel-conductor (or lift KEEL_UPGRADE_LEVELS__CONDUCTOR) first."
    )
