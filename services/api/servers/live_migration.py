"""``os-migrateLive``: move a running (or paused) server to another host while it runs.

Admins only (403 otherwise). The body, as Nova's schemas have it:

* below 2.25: ``host`` (a host name or null), ``block_migration`` and
  ``disk_over_commit`` (booleans), all three required;
* from 2.25: ``host`` and ``block_migration`` (a boolean or ``"auto"``), both required;
  ``disk_over_commit`` is refused;
* from 2.30 to 2.67: ``force`` (boolean): a named host skips the scheduler's filters (the
  claim is still atomic); from 2.68 ``force`` is refused.

keel's guests keep their disks on their hosts, so every live migration copies the disk
with the memory: ``block_migration`` is accepted whatever its value, and so is
``disk_over_commit`` (the claim on the destination counts the disk either way).

The server must be ACTIVE or PAUSED with no task (409), its host's compute service up
(409); a named host must be another compute host (400 ``Compute host H could not be
found.``, or 400 naming the server's own host). Then the move workflow records it (the
task ``migrating``, a record of type ``live-migration``), casts it to a conductor
(:mod:`services.conductor.moves.live`) and answers 202; a cast that cannot be sent is
withdrawn and answered 503. No valid host ends the record ``error`` and leaves the
server ACTIVE on its source. A deployment whose conductors or agents do not all speak
live migration yet (release 27, ``yawl``) is refused with 409 naming them.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from services.api.http.faults import BadRequest, Forbidden
from services.api.http.microversion import APIVersion
from services.api.servers.moves import requested_host, start_move
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.objects.instance import Instance
from shared.objects.migration import LIVE_MIGRATION

ACTION = "os-migrateLive"

_TRUE = {"true", "1", "yes", "on", "y", "t"}
_FALSE = {"false", "0", "no", "off", "n", "f"}


def _boolean(name: str, value: Any, *, auto: bool = False) -> bool | None:
    """A boolean as Nova's ``parameter_types.boolean`` takes it; ``None`` for ``"auto"``."""
    if isinstance(value, bool):
        return value
    if auto:
        if value == "auto":
            return None
        raise BadRequest(
            f"Invalid input for field/attribute {name}. Value: {str(value)[:60]}. "
            f"{str(value)[:60]!r} is not one of [True, False, 'auto']"
        )
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise BadRequest(
        f"Invalid input for field/attribute {name}. Value: {str(value)[:60]}. "
        f"{str(value)[:60]!r} is not a valid boolean"
    )


def live_migration_request(value: Any, version: APIVersion) -> tuple[str | None, bool]:
    """The requested host and whether it is forced, from an ``os-migrateLive`` body."""
    if not isinstance(value, dict):
        raise BadRequest(f"Invalid input for field/attribute {ACTION}: it must be an object.")
    required = ["block_migration", "host"]
    allowed = set(required)
    if not version.at_least("2.25"):
        required.insert(1, "disk_over_commit")
        allowed.add("disk_over_commit")
    if version.at_least("2.30") and not version.at_least("2.68"):
        allowed.add("force")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise BadRequest(
            f"Invalid input for field/attribute {ACTION}: additional properties are not "
            f"allowed ({', '.join(repr(k)[:60] for k in unknown)})."
        )
    for name in required:
        if name not in value:
            raise BadRequest(f"Invalid input for field/attribute {ACTION}: '{name}' is a "
                             "required property")  # fmt: skip
    _boolean("block_migration", value["block_migration"], auto=version.at_least("2.25"))
    if "disk_over_commit" in value:
        _boolean("disk_over_commit", value["disk_over_commit"])
    forced = bool(_boolean("force", value["force"])) if "force" in value else False
    host = value["host"]
    if host is not None and not isinstance(host, str):
        raise BadRequest("Invalid input for field/attribute host: not a host name.")
    if isinstance(host, str):
        host = requested_host({"host": host})
    return host, forced


async def live_migrate(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    version: APIVersion,
    instance: Instance,
    value: Any,
) -> None:
    if not ctx.is_admin:
        raise Forbidden(
            "Policy doesn't allow os_compute_api:os-migrate-server:migrate_live to be performed."
        )
    host, forced = live_migration_request(value, version)
    await start_move(
        pool,
        conductor,
        compute,
        kind=LIVE_MIGRATION,
        settings=settings,
        ctx=ctx,
        instance=instance,
        target=host,
        forced=forced,
    )
