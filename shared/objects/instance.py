"""A row of ``instances`` and the records that hang off it."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from shared import hostnames
from shared.objects.base import KeelModel
from shared.objects.flavor import FlavorSnapshot
from shared.objects.server_group import GroupPlacement


class InstanceFault(KeelModel):
    code: int = 500
    message: str
    details: str = ""
    created: datetime


class Instance(KeelModel):
    id: int
    uuid: UUID
    project_id: str
    user_id: str
    display_name: str
    #: Where the instance runs, as the API shows it: the compute host and node names.
    host: str | None
    node: str | None
    #: The link that routing and ownership follow: the compute node's id. ``None`` until
    #: placed, and on rows an older release wrote until the online data migration ran.
    compute_id: int | None = None
    vm_state: str
    task_state: str | None
    power_state: int
    flavor: FlavorSnapshot
    image_ref: str
    availability_zone: str | None
    fault: InstanceFault | None
    launched_at: datetime | None
    terminated_at: datetime | None
    created_at: datetime
    updated_at: datetime | None
    deleted_at: datetime | None
    #: What the user said about the server: key/value pairs, a description, tags, and
    #: the user data (base64) its guest reads at first boot.
    metadata: dict[str, str] = Field(default_factory=dict)
    description: str | None = None
    tags: list[str] = Field(default_factory=list)
    user_data: str | None = None
    #: The key pair named at create time (its public key is kept as ``key_data``).
    key_name: str | None = None
    #: The key pair's public key as it was at create time.
    key_data: str | None = None
    #: The user asked for a config drive.
    config_drive: bool = False
    #: The guest's host name, as asked for or made from the name at create time;
    #: ``None`` on servers created before keel kept it (see :attr:`guest_hostname`).
    hostname: str | None = None
    #: The standard properties of its image when it was created (see
    #: :mod:`shared.image_properties`); empty on servers created before keel kept them.
    image_properties: dict[str, str] = Field(default_factory=dict)
    #: The addresses its owner says it is reached at (``accessIPv4`` / ``accessIPv6``).
    access_ip_v4: str | None = None
    access_ip_v6: str | None = None
    #: The request that created it with others (``r-xxxxxxxx``), and its place among them.
    reservation_id: str | None = None
    launch_index: int = 0
    #: The token of the server's current copy (see :mod:`shared.copy_tokens`).
    copy_token: UUID | None = None
    #: Who locked it (``owner`` or ``admin``) and why; ``None`` while unlocked.
    locked_by: str | None = None
    locked_reason: str | None = None
    #: When a DELETE with soft delete on made it SOFT_DELETED (``None`` in any other
    #: state): the reclaim sweep deletes it for good once the interval has passed.
    soft_deleted_at: datetime | None = None
    #: What keel keeps about the server for itself (Nova's system metadata): a shelved
    #: server's ``shelved_image_id``, ``shelved_at`` and ``shelved_host``.
    system_metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def guest_hostname(self) -> str:
        """The host name the guest is given and the API shows: the one kept, or for a
        server created before keel kept one, made from its name as it was then."""
        return self.hostname or hostnames.from_name(self.display_name, self.uuid)


class RequestedDestination(KeelModel):
    """Where one request asks to be placed: the compute nodes of a named host and/or
    hypervisor hostname, resolved to node ids by keel-api.

    The scheduler narrows its candidates to ``node_ids`` and still runs every filter;
    ``forced`` (the ``zone:host[:node]`` form) skips the filters, never the atomic claim.
    """

    host: str | None = None
    node: str | None = None
    node_ids: list[int] = Field(min_length=1)
    forced: bool = False

    def describe(self) -> str:
        named = " and ".join(
            part
            for part in (
                f"host {self.host}" if self.host else "",
                f"node {self.node}" if self.node else "",
            )
            if part
        )
        return f"{named} (forced)" if self.forced else named


class RequestSpec(KeelModel):
    """What was asked for when the instance was created: the scheduler's input."""

    instance_uuid: UUID
    project_id: str
    user_id: str
    flavor: FlavorSnapshot
    image_ref: str = ""
    availability_zone: str | None = None
    #: Compute nodes (by UUID) this request must not be placed on.
    ignore_nodes: list[UUID] = Field(default_factory=list)
    #: Host names to avoid, as older releases wrote them; honoured by name only through
    #: the logged fallback of the IgnoreHostsFilter. keel writes ``ignore_nodes``.
    ignore_hosts: list[str] = Field(default_factory=list)
    #: Who holds the claim this request makes: a move's migration (so the instance can
    #: keep its claim on the source meanwhile); unset, the instance itself. One request
    #: only: never stored with the spec.
    consumer_uuid: UUID | None = None
    #: Where this request asks to be placed. One request only: never stored with the
    #: spec, so later moves choose freely.
    requested_destination: RequestedDestination | None = None
    #: The server group of the instance and where its other members are: read by the
    #: scheduler itself, under the group's lock, in the transaction that claims. Never
    #: sent or stored: senders leave it unset.
    group: GroupPlacement | None = None

    @model_serializer(mode="wrap")
    def _without_empty_ignore_nodes(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Leave out an empty ``ignore_nodes``, an unset ``consumer_uuid`` and an unset
        ``requested_destination``, so releases that do not know them read specs."""
        data = handler(self)
        if isinstance(data, dict):
            if not self.ignore_nodes:
                data.pop("ignore_nodes", None)
            if self.consumer_uuid is None:
                data.pop("consumer_uuid", None)
            if self.requested_destination is None:
                data.pop("requested_destination", None)
            if self.group is None:
                data.pop("group", None)
        return data

    @property
    def consumer(self) -> UUID:
        """Who the claim of this request is for."""
        return self.consumer_uuid or self.instance_uuid


class Allocation(KeelModel):
    """What one consumer (an instance, or a migration during a move) holds on one node."""

    consumer_uuid: UUID
    instance_uuid: UUID
    compute_node_id: int
    vcpus: int
    memory_mb: int
    local_gb: int


class InstanceAction(KeelModel):
    """A row of ``instance_actions``: one thing done to an instance, and how it ended."""

    id: int
    instance_uuid: UUID
    action: str
    request_id: str | None
    user_id: str | None
    project_id: str | None
    message: str | None
    start_time: datetime
    finish_time: datetime | None
    result: str | None = None
