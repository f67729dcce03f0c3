"""``POST /servers/{id}/action {"resize": {"flavorRef": ...}}``: a cold migration with a new
flavor.

The server's owner (or an admin) may resize it; it must be ACTIVE or SHUTOFF with no
task, its compute service up, and every conductor at release 15 (``norman``) or later
(409 otherwise, naming what is too old). The flavor must exist and be enabled (400), be
another flavor than the server's (400 ``When resizing, instances must change
flavor!``) and not shrink its disk (400 ``Resize error: Unable to resize disk down.``).
What the larger flavor adds (cores, RAM) must fit the project's quota, and the user's
where one is set (403), checked in the transaction that records the resize, so two
resizes at once cannot both overrun it.

Then it is a cold migration (:mod:`services.api.servers.moves`) whose record (type
``resize``) carries the old and the new flavor: the scheduler claims the new flavor on
another host, the copy there is built with it, and the server shows VERIFY_RESIZE with
its new flavor; ``confirmResize`` keeps it, ``revertResize`` returns the server to its
source with its old flavor. keel always resizes to another host.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from services.api.http.faults import BadRequest
from services.api.resources.quotas import check_resize
from services.api.servers.lookup import last_segment
from services.api.servers.moves import start_move
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.db import flavors
from shared.db.pool import Connection
from shared.exceptions import FlavorNotFound
from shared.objects.instance import Instance
from shared.objects.migration import RESIZE

ACTION = "resize"
_DISK_CONFIGS = ("AUTO", "MANUAL")


def flavor_ref(value: Any) -> str:
    """The ``flavorRef`` of a ``resize`` body, checked as Nova's schema does."""
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute resize: it must be an object.")
    unknown = sorted(set(value) - {"flavorRef", "OS-DCF:diskConfig"})
    if unknown:
        raise BadRequest(
            "Invalid input for field/attribute resize: additional properties are not "
            f"allowed ({', '.join(repr(k)[:60] for k in unknown)})."
        )
    ref = value.get("flavorRef")
    if isinstance(ref, bool) or not isinstance(ref, (str, int)) or str(ref) == "":
        raise BadRequest("Invalid input for field/attribute flavorRef: a flavor id is required.")
    disk_config = value.get("OS-DCF:diskConfig")
    if disk_config is not None and disk_config not in _DISK_CONFIGS:
        raise BadRequest(
            "Invalid input for field/attribute OS-DCF:diskConfig: it must be AUTO or MANUAL."
        )
    return last_segment(str(ref))


async def resize(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    instance: Instance,
    value: Any,
) -> None:
    flavor_id = flavor_ref(value)
    async with pool.acquire() as conn:
        try:
            flavor = await flavors.get(conn, flavor_id)
        except FlavorNotFound:
            raise BadRequest(f"Flavor {flavor_id} could not be found.") from None
    if flavor.disabled:
        raise BadRequest(f"Flavor {flavor_id} is disabled.")
    old, new = instance.flavor, flavor.snapshot()
    if new.flavorid == old.flavorid:
        raise BadRequest("When resizing, instances must change flavor!")
    if new.root_gb < old.root_gb:
        raise BadRequest("Resize error: Unable to resize disk down.")

    async def within_quota(conn: Connection) -> None:
        await check_resize(
            conn, instance.project_id, settings.quota, old, new, user_id=instance.user_id
        )

    await start_move(
        pool,
        conductor,
        compute,
        kind=RESIZE,
        settings=settings,
        ctx=ctx,
        instance=instance,
        target=None,
        flavors=(old, new),
        check=within_quota,
    )
