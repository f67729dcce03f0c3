"""A new server's rows in one statement: the instance with what its create asked for,
its request spec and its ``create`` action.

keel-api's create writes them inside the transaction that checks the quota; one round
trip instead of four (the instance, its fields, its spec, its action), and all of them or
none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from shared.context import RequestContext
from shared.db.pool import Connection
from shared.db.request_specs import stored
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Instance, RequestSpec
from shared.objects.states import TaskState, VmState


@dataclass(frozen=True)
class NewServer:
    """The instance row of a server being created, as its create request made it."""

    instance_uuid: UUID
    project_id: str
    user_id: str
    display_name: str
    hostname: str
    flavor: FlavorSnapshot
    image_ref: str
    availability_zone: str | None
    reservation_id: str | None = None
    launch_index: int = 0
    config_drive: bool = False
    image_properties: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    description: str | None = None
    tags: Sequence[str] = ()
    user_data: str | None = None
    access_ip_v4: str | None = None
    access_ip_v6: str | None = None


async def insert(
    conn: Connection,
    new: NewServer,
    *,
    spec: RequestSpec,
    scheduler_hints: dict[str, list[str]] | None,
    ctx: RequestContext,
    action: str,
) -> Instance:
    """Insert the instance (building, scheduling), its spec and its open ``action``."""
    row = await conn.fetchrow(
        """WITH created AS (
               INSERT INTO instances (uuid, project_id, user_id, display_name, vm_state,
                                      task_state, flavor, image_ref, availability_zone,
                                      reservation_id, launch_index, config_drive, hostname,
                                      image_properties, metadata, description, tags,
                                      user_data, access_ip_v4, access_ip_v6)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                       $17, $18, $19, $20)
               RETURNING *
           ), spec AS (
               INSERT INTO request_specs (instance_uuid, spec, scheduler_hints)
               SELECT uuid, $21, $22 FROM created
           ), action AS (
               INSERT INTO instance_actions (instance_uuid, action, request_id, user_id,
                                             project_id)
               SELECT uuid, $23, $24, $25, $26 FROM created
           )
           SELECT * FROM created""",
        new.instance_uuid,
        new.project_id,
        new.user_id,
        new.display_name,
        VmState.BUILDING.value,
        TaskState.SCHEDULING.value,
        new.flavor.model_dump(mode="json"),
        new.image_ref,
        new.availability_zone,
        new.reservation_id,
        new.launch_index,
        new.config_drive,
        new.hostname,
        new.image_properties,
        new.metadata,
        new.description,
        list(new.tags),
        new.user_data,
        new.access_ip_v4,
        new.access_ip_v6,
        stored(spec),
        scheduler_hints or {},
        action,
        ctx.request_id,
        ctx.user_id,
        ctx.project_id,
    )
    assert row is not None
    return Instance.from_row(row)
