"""``POST /servers/{id}/action {"os-resetState": {"state": ...}}``: an admin resets a
server stuck in a state keel's own deadlines did not end (``openstack server set --state``).

As Nova's ``os-resetState``, at every microversion: admins only (403 for anyone else);
``state`` is ``active`` or ``error`` (400 for anything else, nothing changed). In one
transaction the server's vm_state becomes ACTIVE or ERROR, its task state is cleared,
and a ``resetState`` instance action is recorded, started and finished; the answer is 202
with no body. No agent is told: the guest is not touched, and the power state stays
what the host last reported. A move in flight is left to its own workflow, which keeps
the server where it lives when it finds the task ended: a live migration not yet
switched over fails (the source resumes the guest), a revert not yet begun is abandoned
(the server stays on the destination).

Refusals Nova does not make (409, nothing changed), each where a reset would break a
promise keel made:

* a server whose build never succeeded has no guest anywhere, so it is not made ACTIVE;
  it may be reset to ERROR, or deleted; nor is one in ERROR because its last rebuild
  failed (its old guest may be destroyed and no new one runs): a rebuild again brings it
  back;
* a server offloaded or being offloaded by a shelve: its copy is its shelved image, not
  a guest on a host (an offload that does not finish is completed by keel's task
  deadline, an unshelve that does not finish is sent back by the build deadline);
* a server being deleted: keel-api answered its delete 204, and the delete goes on
  (its agent may be destroying the guest already). If its agent is down, deleting it
  again deletes it without the agent;
* a server soft-deleted, or being soft-deleted: its delete was answered 204 and is
  reclaimed in time unless it is restored; a restore brings it back with its guest
  started, a reset would leave it ACTIVE with its guest off (or, during the soft delete,
  end it: the server would stay).

Resetting is a plain write of what the admin asked, so two resets at once both succeed
and the later one's state stays; each is logged with the states it replaced.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from services.api.http.faults import BadRequest, ConflictingRequest, Forbidden, ItemNotFound
from shared.context import RequestContext
from shared.db import instance_actions, instances, snapshots
from shared.db.pool import Connection
from shared.db.transaction import in_transaction
from shared.objects.instance import Instance
from shared.objects.states import SNAPSHOT_TASKS, VmState

LOG = logging.getLogger(__name__)

#: The action's name in the request body.
ACTION = "os-resetState"
#: Its name in the server's instance actions, as Nova records it.
INSTANCE_ACTION = "resetState"
#: What an admin may set, by the name the API takes.
STATES: dict[str, VmState] = {"active": VmState.ACTIVE, "error": VmState.ERROR}
POLICY = "os_compute_api:os-admin-actions:reset_state"


def requested_state(value: Any) -> VmState:
    """The state the body asks for, checked as Nova's schema checks it."""
    if not isinstance(value, dict) or set(value) != {"state"}:
        raise BadRequest(
            "Invalid input for field/attribute os-resetState: it must be an object with "
            "exactly one property, 'state'."
        )
    state = value["state"]
    if not isinstance(state, str) or state not in STATES:
        shown = repr(state)[:60]
        raise BadRequest(
            f"Invalid input for field/attribute state. Value: {shown}. {shown} is not one "
            "of ['active', 'error']"
        )
    return STATES[state]


async def reset_state(
    pool: asyncpg.Pool, *, ctx: RequestContext, instance: Instance, value: Any
) -> None:
    if not ctx.is_admin:
        raise Forbidden(f"Policy doesn't allow {POLICY} to be performed.")
    state = requested_state(value)

    async def reset(conn: Connection) -> tuple[Instance, Instance] | None:
        changed = await instances.reset_state(conn, instance.uuid, state)
        if changed is None:
            return None
        if changed[0].task_state in SNAPSHOT_TASKS:
            # The snapshot's agent will not take it now: its image never gets its data.
            await snapshots.kill_unfinished(conn, instance.uuid)
        await instance_actions.start(conn, ctx, instance.uuid, INSTANCE_ACTION)
        await instance_actions.finish(conn, instance.uuid, INSTANCE_ACTION)
        return changed

    try:
        changed = await in_transaction(pool, reset, what=f"resetting the state of {instance.uuid}")
    except instances.NotResettable as exc:
        raise ConflictingRequest(str(exc)) from None
    if changed is None:
        raise ItemNotFound(f"Instance {instance.uuid} could not be found.")
    before, _ = changed
    LOG.warning(
        "state of server %s reset to %s by user %s: it was %s with task %s",
        instance.uuid,
        state.value,
        ctx.user_id,
        before.vm_state,
        before.task_state or "none",
        extra={"instance_uuid": str(instance.uuid), "decision": "state_reset"},
    )
