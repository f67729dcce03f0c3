"""What a create request says about a server besides flavor and image, validated as Nova does.

:class:`ServerFields` is the part of the request body that carries metadata, a
description (from microversion 2.19), tags (from 2.52), user data (base64, at most
65535 characters), the requested networks and block device mappings. :func:`prepare`
checks them against the request's microversion and the configured network and returns
:class:`PreparedFields`, which the create transaction records on the new instance row,
with its fixed address: an address that cannot be given rolls the whole create back.

Networks: ``"none"`` gets no address; ``"auto"``, ``[]`` or no ``networks`` gets one on
the configured network; a list names networks by ``uuid`` (the configured one, or
networks the project created; with a ``fixed_ip`` if wanted) and the server gets one
address per entry, in the list's order (a network named twice gives two). A network
that does not exist, or has no subnet, is a 400. keel has no ports and no volumes:
asking for them is a 400, never ignored. Security groups: the project's ``default`` and
the groups it created, by name (or id); an unknown one is a 400, as in Nova.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

from services.api.http.faults import BadRequest, ConflictingRequest
from services.api.http.microversion import APIVersion
from shared.config import NetworkSettings
from shared.db import fixed_ips, project_networks, security_groups
from shared.db.pool import Connection
from shared.db.project_networks import NetworkRequiresSubnet
from shared.db.security_groups import GroupNameRefused, SecurityGroup
from shared.exceptions import InvalidFixedIp
from shared.objects.network import FixedIp

MAX_TAGS = 50
MAX_USER_DATA = 65535
METADATA_LENGTH = 255
_METADATA_KEY = re.compile(r"[A-Za-z0-9_:. -]{1,255}")
_PASSWORD_CHARS = string.ascii_letters + string.digits
PASSWORD_LENGTH = 12


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


def check_metadata(value: object) -> object:
    """Nova's rules: an object of 1 to 255 of ``[A-Za-z0-9_:. -]`` to strings up to 255."""
    if not isinstance(value, dict):
        raise ValueError(f"metadata must be an object, not {json_type(value)}")
    for key, item in value.items():
        if not isinstance(key, str) or not _METADATA_KEY.fullmatch(key):
            raise ValueError(
                f"metadata key {key!r} must be 1 to {METADATA_LENGTH} letters, digits, "
                "spaces or '_:.-'"
            )
        if not isinstance(item, str):
            raise ValueError(
                f"the value of metadata key {key!r} must be a string, not {json_type(item)}"
            )
        if len(item) > METADATA_LENGTH:
            raise ValueError(
                f"the value of metadata key {key!r} is longer than {METADATA_LENGTH} characters"
            )
    return value


def check_description(value: object) -> object:
    if isinstance(value, str) and not value.isprintable():
        raise ValueError("the description must not contain control characters")
    return value


def check_name(value: str) -> str:
    if value != value.strip():
        raise ValueError("must not start or end with whitespace")
    if not value.isprintable():
        raise ValueError("must not contain control characters")
    return value


def check_user_data(value: object) -> object:
    if not isinstance(value, str):
        return value
    if len(value) > MAX_USER_DATA:
        raise ValueError(f"user_data must be at most {MAX_USER_DATA} characters of base64")
    try:
        base64.b64decode("".join(value.split()), validate=True)
    except binascii.Error:
        raise ValueError("user_data must be base64-encoded") from None
    return value


def check_ip_address(value: object) -> object:
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None
    return value


def _access_ip(version: int) -> Any:
    """A validator of an access address: a string holding an IPv``version`` address,
    kept in its normal form (``2001:DB8::0001`` → ``2001:db8::1``); null is refused, as
    Nova refuses it (leave the field out instead)."""

    def check(value: object) -> object:
        if value is None:
            raise ValueError(f"an IPv{version} address must be a string, not null")
        if not isinstance(value, str):
            return value
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            address = None
        if address is None or address.version != version:
            raise ValueError(f"{value!r} is not an IPv{version} address")
        return str(address)

    return BeforeValidator(check)


#: ``None`` only when the field is left out (its default is not validated).
AccessIPv4 = Annotated[str | None, _access_ip(4)]
AccessIPv6 = Annotated[str | None, _access_ip(6)]

ServerName = Annotated[
    str, StringConstraints(min_length=1, max_length=255), AfterValidator(check_name)
]
Metadata = Annotated[dict[str, str], BeforeValidator(check_metadata)]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=60, pattern=r"^[^,/]*$")]
Tags = Annotated[list[Tag], Field(max_length=MAX_TAGS)]
Description = Annotated[str | None, Field(max_length=255), BeforeValidator(check_description)]
UserData = Annotated[str | None, BeforeValidator(check_user_data)]


class RequestedNetwork(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uuid: str | None = None
    port: str | None = None
    fixed_ip: Annotated[str | None, BeforeValidator(check_ip_address)] = None
    tag: Tag | None = None


class SecurityGroupRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=255)


async def find_groups(
    conn: Connection, project_id: str, names: list[str] | None
) -> list[SecurityGroup] | None:
    """The groups a create names (``None`` when it names none): each a 400 if unknown, as
    in Nova, and a 409 if several of the project's groups have that name."""
    if names is None:
        return None
    found = []
    for name in names:
        try:
            group = await security_groups.find(conn, project_id, name)
        except GroupNameRefused as exc:
            raise ConflictingRequest(exc.message) from None
        if group is None:
            raise BadRequest(f"Security group {name} not found.")
        found.append(group)
    return found


class BlockDevice(BaseModel):
    """One ``block_device_mapping_v2`` entry; keel reads only what says where it boots from."""

    model_config = ConfigDict(extra="allow")

    source_type: str | None = None
    destination_type: str | None = None
    uuid: str | None = None
    boot_index: int | str | None = None


class ServerFields(BaseModel):
    """The create request's fields this module validates and records."""

    model_config = ConfigDict(extra="ignore")

    metadata: Metadata = Field(default_factory=dict)
    description: Description = None
    tags: Tags = Field(default_factory=list)
    user_data: UserData = None
    networks: list[RequestedNetwork] | Literal["auto", "none"] | None = None
    block_device_mapping_v2: list[BlockDevice] | None = None
    block_device_mapping: list[dict[str, Any]] | None = None
    admin_pass: str | None = Field(default=None, alias="adminPass")
    #: Where the server is reached, as its owner says (stored and shown, nothing more).
    access_ip_v4: AccessIPv4 = Field(default=None, alias="accessIPv4")
    access_ip_v6: AccessIPv6 = Field(default=None, alias="accessIPv6")
    #: The project's groups by name; none given: its ``default`` group.
    security_groups: list[SecurityGroupRef] | None = None
    #: Files to inject (before 2.57): keel injects none, so only an empty list is taken.
    personality: list[Any] | None = None
    #: Certificates to verify the image with (2.63): keel verifies no signatures, so
    #: only an empty list or null is taken.
    trusted_image_certificates: list[Any] | None = None


@dataclass(frozen=True)
class AddressRequest:
    fixed_ip: str | None = None
    tag: str | None = None
    #: The network asked for; ``None``: the configured one.
    network_id: UUID | None = None


@dataclass(frozen=True)
class PreparedFields:
    """Validated fields, ready to be recorded on the new instance in its transaction."""

    network: NetworkSettings
    metadata: dict[str, str] = field(default_factory=dict)
    description: str | None = None
    tags: list[str] = field(default_factory=list)
    user_data: str | None = None
    addresses: list[AddressRequest] = field(default_factory=list)
    admin_pass: str = ""
    access_ip_v4: str | None = None
    access_ip_v6: str | None = None
    #: The security groups asked for by name; ``None``: the project's default group.
    security_groups: list[str] | None = None

    async def record(
        self, conn: Connection, instance_uuid: UUID, project_id: str = "", is_admin: bool = False
    ) -> list[FixedIp]:
        """Store the security groups and allocate the addresses of the instance just
        inserted (the other fields are written with its row); a 400/409 rolls the create
        back."""
        groups = await find_groups(conn, project_id, self.security_groups)
        if groups is not None:
            await security_groups.record_created(conn, instance_uuid, groups)
        held = []
        for position, wanted in enumerate(self.addresses):
            try:
                held.append(
                    await self._allocate(
                        conn,
                        instance_uuid,
                        wanted,
                        position=position,
                        project_id=project_id,
                        is_admin=is_admin,
                    )
                )
            except (InvalidFixedIp, NetworkRequiresSubnet) as exc:
                raise BadRequest(exc.message) from None
        return held

    async def _allocate(
        self,
        conn: Connection,
        instance_uuid: UUID,
        wanted: AddressRequest,
        *,
        position: int,
        project_id: str,
        is_admin: bool,
    ) -> FixedIp:
        if wanted.network_id is None or wanted.network_id == self.network.network_id:
            return await fixed_ips.allocate(
                conn,
                self.network,
                instance_uuid,
                address=wanted.fixed_ip,
                tag=wanted.tag,
                position=position,
            )
        network = await project_networks.get_network(conn, wanted.network_id)
        if network is None or not (is_admin or network.project_id == project_id):
            raise BadRequest(f"Network {wanted.network_id} could not be found.")
        return await project_networks.allocate(
            conn,
            network,
            instance_uuid,
            address=wanted.fixed_ip,
            tag=wanted.tag,
            position=position,
        )


def unexpected(name: str, since: str) -> BadRequest:
    return BadRequest(
        f"Invalid input for field/attribute server. Additional properties are not allowed "
        f"('{name}' was unexpected): it needs microversion {since} or later."
    )


def _network_uuid(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise BadRequest(
            f"Bad networks format: network uuid is not in proper format ({value})"
        ) from None


def address_requests(
    networks: list[RequestedNetwork] | str | None, network: NetworkSettings, version: APIVersion
) -> list[AddressRequest]:
    """What addresses the request asks for: one per entry, in order."""
    if networks == "none":
        return []
    if networks is None or isinstance(networks, str) or not networks:
        return [AddressRequest()]
    wanted = []
    for requested in networks:
        if requested.tag is not None and not (
            version == APIVersion(2, 32) or version.at_least("2.42")
        ):
            raise unexpected("tag", "2.42")
        if requested.port is not None:
            raise BadRequest(f"Port {requested.port} could not be found.")
        if requested.uuid is None:
            raise BadRequest("Bad network format: missing 'uuid'")
        wanted.append(
            AddressRequest(
                fixed_ip=requested.fixed_ip,
                tag=requested.tag,
                network_id=_network_uuid(requested.uuid),
            )
        )
    return wanted


def _boots_from_image(device: BlockDevice) -> bool:
    return (
        device.source_type == "image"
        and device.destination_type in (None, "local")
        and str(device.boot_index) == "0"
    )


def check_block_devices(fields: ServerFields, image_id: str) -> None:
    """Only the image-backed root disk the client sends by default: keel has no volumes."""
    invalid = "Block Device Mapping is Invalid: keel has no volumes or extra disks"
    if fields.block_device_mapping:
        raise BadRequest(f"{invalid}; leave out block_device_mapping.")
    devices = fields.block_device_mapping_v2 or []
    for device in devices:
        if not _boots_from_image(device):
            raise BadRequest(
                f"{invalid}: only the root disk from the server's image (source_type "
                f"'image', destination_type 'local', boot_index 0) can be given, not "
                f"source_type {device.source_type!r} / destination_type "
                f"{device.destination_type!r}."
            )
        if device.uuid is not None and device.uuid != image_id:
            raise BadRequest(
                f"{invalid}: the root disk's image {device.uuid} is not the server's "
                f"image {image_id}."
            )
    if len(devices) > 1:
        raise BadRequest(f"{invalid}: give at most one root disk.")


def new_password() -> str:
    return "".join(secrets.choice(_PASSWORD_CHARS) for _ in range(PASSWORD_LENGTH))


def prepare(
    fields: ServerFields, image_id: str, version: APIVersion, network: NetworkSettings
) -> PreparedFields:
    """Check the fields against the microversion; what the create transaction records."""
    given = fields.model_fields_set
    if "description" in given and not version.at_least("2.19"):
        raise unexpected("description", "2.19")
    if "tags" in given and not version.at_least("2.52"):
        raise unexpected("tags", "2.52")
    if "personality" in given:
        if version.at_least("2.57"):
            raise BadRequest(
                "Invalid input for field/attribute server. Additional properties are not "
                "allowed ('personality' was unexpected): it was removed in microversion 2.57."
            )
        if fields.personality:
            raise BadRequest(
                "keel does not inject files into guests (personality); pass them in "
                "user_data instead."
            )
    if "trusted_image_certificates" in given:
        if not version.at_least("2.63"):
            raise unexpected("trusted_image_certificates", "2.63")
        if fields.trusted_image_certificates:
            raise BadRequest(
                "keel does not verify image signatures: trusted_image_certificates must be "
                "empty or null."
            )
    check_block_devices(fields, image_id)
    return PreparedFields(
        network=network,
        metadata=dict(fields.metadata),
        description=fields.description,
        tags=list(dict.fromkeys(fields.tags)),
        user_data=fields.user_data,
        addresses=address_requests(fields.networks, network, version),
        admin_pass=fields.admin_pass if fields.admin_pass is not None else new_password(),
        access_ip_v4=fields.access_ip_v4,
        access_ip_v6=fields.access_ip_v6,
        security_groups=(
            None
            if fields.security_groups is None
            else list(dict.fromkeys(group.name for group in fields.security_groups))
        ),
    )
