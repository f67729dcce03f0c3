"""What must hold after every step of the model, and what must hold once all is quiet.

* **I0** keel-api never answers 5xx but 503, and 503 means nothing happened (a delete
  answered 503 left its server, only creates answered 202 or not answered at all made
  servers — checked by the machine at quiescence); no message is dead-lettered because
  its handler failed unexpectedly (a poison message is a bug; a cast dead-lettered after
  its delivery limit is not).
* **I1** claims: every claim is one its holder may have — an instance's own claim on
  its node, or on the source or destination of one of its moves that still holds
  claims; a move's claim only while the move holds claims — and every node's usage is
  the sum of its claims. At quiescence: a live server (not ERROR) holds exactly one
  claim, its own, on its node; one in ERROR at most that; a deleted one none; and every
  copy of a server, whatever its state, sits where it holds a claim.
* **I2** never two running copies of one server. At quiescence exactly one copy of
  each live server (not ERROR), on its node; at most that for one in ERROR; none of a
  deleted one. Guests recorded as orphans, and hosts deleted for good, aside.
* **I3** a copy keel still needs is never destroyed (judged when the driver is asked,
  see :func:`protected`): the server's current copy (its copy token) from the moment
  it is built (but by the rebuild its owner asked for), a move's new copy while the
  move runs, the copy a revert returns to.
* **I4** at quiescence no task state, no server still building, no move that has not
  ended, no snapshot image still waiting for its data.
* **I5** every committed transition is in the state table
  (:mod:`shared.objects.transitions`, which keel's writers of states check too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from shared.db import allocations as allocation_queries
from shared.db.pool import Connection
from shared.objects import transitions as states
from tests.model.hosts import Host
from tests.model.world import World


@dataclass(frozen=True)
class Row:
    uuid: UUID
    vm: str
    task: str | None
    node: int | None
    deleted: bool
    #: The token of the server's current copy.
    token: UUID | None = None


@dataclass(frozen=True)
class Move:
    uuid: UUID
    instance: UUID
    kind: str
    status: str
    source: int | None
    dest: int | None
    #: The token of the copy it started from.
    source_token: UUID | None = None


@dataclass(frozen=True)
class Claim:
    consumer: UUID
    instance: UUID
    node: int


@dataclass
class Snapshot:
    instances: dict[UUID, Row]
    #: Every server, in the order they were created.
    order: list[UUID]
    moves: list[Move]
    claims: list[Claim]
    drift: list[Any]
    orphans: set[tuple[int, UUID]]
    node_ids: dict[UUID, int]
    #: Nodes deleted with their service (a host gone for good).
    gone_nodes: set[int]
    #: Rows of ``model_transitions`` recorded since the last look, oldest first.
    transitions: list[dict[str, Any]]
    #: Server snapshots' images still waiting for their data (queued or saving).
    unfinished_images: int = 0

    def moves_of(self, instance: UUID) -> list[Move]:
        return [m for m in self.moves if m.instance == instance]


#: I1's "usage is the sum of claims": every node whose recorded usage differs from the
#: sum of its allocations (the rows of keel's own ``allocations.usage_drift``).
_DRIFT = """
SELECT n.id AS node_id,
       n.vcpus_used, coalesce(sum(a.vcpus), 0)::int AS vcpus_allocated,
       n.memory_mb_used, coalesce(sum(a.memory_mb), 0)::int AS memory_mb_allocated,
       n.local_gb_used, coalesce(sum(a.local_gb), 0)::int AS local_gb_allocated
  FROM compute_nodes n LEFT JOIN allocations a ON a.compute_node_id = n.id
 GROUP BY n.id
HAVING n.vcpus_used <> coalesce(sum(a.vcpus), 0)
    OR n.memory_mb_used <> coalesce(sum(a.memory_mb), 0)
    OR n.local_gb_used <> coalesce(sum(a.local_gb), 0)
"""

_SNAPSHOT = f"""
SELECT
  (SELECT coalesce(json_agg(json_build_array(uuid, vm_state, task_state, compute_id,
                                             deleted_at IS NOT NULL, copy_token) ORDER BY id),
                   '[]')
     FROM instances) AS instances,
  (SELECT coalesce(json_agg(json_build_array(uuid, instance_uuid, migration_type, status,
                                             source_compute_id, dest_compute_id, source_token)
                            ORDER BY id),
                   '[]')
     FROM migrations WHERE deleted_at IS NULL) AS moves,
  (SELECT coalesce(json_agg(json_build_array(consumer_uuid, instance_uuid, compute_node_id)
                            ORDER BY id), '[]')
     FROM allocations) AS claims,
  (SELECT coalesce(json_agg(json_build_array(compute_node_id, instance_uuid)), '[]')
     FROM orphaned_guests) AS orphans,
  (SELECT coalesce(json_agg(json_build_array(id, uuid, deleted_at IS NOT NULL)), '[]')
     FROM compute_nodes) AS nodes,
  (SELECT coalesce(json_agg(row_to_json(d) ORDER BY d.node_id), '[]') FROM ({_DRIFT}) d) AS drift,
  (SELECT coalesce(json_agg(row_to_json(t) ORDER BY t.id), '[]')
     FROM model_transitions t WHERE t.id > $1) AS transitions,
  (SELECT count(*) FROM images
    WHERE deleted_at IS NULL AND status IN ('queued', 'saving')
      AND properties ? 'instance_uuid') AS unfinished_images
"""


async def snapshot(conn: Connection, transitions_after: int = 0) -> Snapshot:
    """The rows the invariants judge, read in one statement (one consistent view, and one
    round trip: the model reads it after every step), with the state changes recorded
    since transition ``transitions_after``."""
    row = await conn.fetchrow(_SNAPSHOT, transitions_after)
    assert row is not None
    instances = [
        Row(UUID(u), vm, task, node, gone, _uuid(token))
        for u, vm, task, node, gone, token in row["instances"]
    ]
    return Snapshot(
        instances={r.uuid: r for r in instances},
        order=[r.uuid for r in instances],
        moves=[
            Move(UUID(u), UUID(i), k, st, src, dst, _uuid(tok))
            for u, i, k, st, src, dst, tok in row["moves"]
        ],
        claims=[Claim(UUID(c), UUID(i), n) for c, i, n in row["claims"]],
        drift=[allocation_queries.UsageDrift.model_validate(d) for d in row["drift"]],
        orphans={(n, UUID(i)) for n, i in row["orphans"]},
        node_ids={UUID(u): n for n, u, _ in row["nodes"]},
        gone_nodes={n for n, _, gone in row["nodes"] if gone},
        transitions=[{**t, "subject": UUID(t["subject"])} for t in row["transitions"]],
        unfinished_images=row["unfinished_images"],
    )


def _uuid(value: str | None) -> UUID | None:
    return None if value is None else UUID(value)


def claim_problems(snap: Snapshot) -> list[str]:
    """I1 after any step."""
    problems = [f"I1 usage is not the sum of claims: {d}" for d in snap.drift]
    moves = {m.uuid: m for m in snap.moves}
    for claim in snap.claims:
        instance = snap.instances.get(claim.instance)
        if claim.consumer != claim.instance:
            move = moves.get(claim.consumer)
            deleting = instance is not None and (instance.deleted or instance.task == "deleting")
            if deleting:
                continue  # a cancelled move's claim goes with its server's, at the delete's end
            if move is None or move.status not in states.CLAIMING.get(move.kind, ()):
                problems.append(
                    f"I1 claim of move {claim.consumer} on node {claim.node} while the move is "
                    f"{move.status if move else 'unknown'}"
                )
            elif claim.node not in (move.source, move.dest) and move.dest is not None:
                # The scheduler claims before the conductor records the destination: until
                # it is recorded, the move's claim may be on any node (as a build's).
                problems.append(f"I1 claim of move {move.uuid} on node {claim.node}, not its end")
            continue
        if instance is None:
            problems.append(f"I1 claim on node {claim.node} for unknown instance {claim.instance}")
            continue
        if instance.deleted or instance.task == "deleting":
            continue  # a delete releases every claim of its server at its end: see quiescence
        allowed = {instance.node}
        # The scheduler claims before the conductor records the node: one claim, anywhere
        # — also once an admin reset the server from its scheduling to ERROR, until its
        # build is handled again and gives the claim back (checked strictly at quiescence).
        # So does an unshelve of an offloaded server, until its placement is recorded.
        placing = instance.node is None and instance.vm in ("building", "error")
        placing |= instance.node is None and instance.task == "unshelving"
        if placing and sum(1 for c in snap.claims if c.instance == instance.uuid) == 1:
            continue
        for move in snap.moves_of(instance.uuid):
            if move.status in states.CLAIMING.get(move.kind, ()):
                allowed |= {move.source, move.dest}
        if claim.node not in allowed:
            problems.append(
                f"I1 server {instance.uuid} ({instance.vm}/{instance.task}) on node "
                f"{instance.node} holds a claim on node {claim.node}"
            )
    for instance in snap.instances.values():
        if instance.deleted or instance.node is None or instance.vm in ("error", "building"):
            continue
        if instance.task == "deleting":
            continue
        if not any(c.node == instance.node and c.instance == instance.uuid for c in snap.claims):
            problems.append(
                f"I1 server {instance.uuid} ({instance.vm}/{instance.task}) has no claim on its "
                f"node {instance.node}"
            )
    return problems


def running_problems(snap: Snapshot, hosts: Iterable[Host]) -> list[str]:
    """I2 after any step: never two running copies."""
    where: dict[UUID, list[str]] = {}
    for host in hosts:
        # A host whose service was deleted counts until it is off: its guests may run.
        if host.powered:
            for guest in host.driver.running():
                where.setdefault(guest, []).append(host.name)
    return [
        f"I2 server {guest} runs on {', '.join(names)}"
        for guest, names in where.items()
        if len(names) > 1
    ]


def protected(
    row: Row | None, moves: list[Move], node: int | None, token: UUID | None
) -> str | None:
    """Why the copy of ``row`` carrying ``token`` on ``node`` must not be destroyed now
    (None: it may go).

    Protected are: the server's current copy (its copy token), from the moment it is
    built, whatever the server's state; the copy a move in flight builds on its
    destination; and the copy a cold migration started from while a revert may still
    return to it. A server deleted, or being deleted, protects nothing; a server being
    rebuilt (``rebuild_spawning``) has its copy on its own node replaced, as its owner
    asked.
    """
    if row is None or row.deleted or row.task == "deleting" or node is None:
        return None
    if row.task == "rebuild_spawning" and node == row.node:
        return None
    if token == row.token:
        return f"it carries the server's current copy token ({row.vm}/{row.task})"
    for move in moves:
        if move.status in states.IN_FLIGHT and move.dest == node and token == move.uuid:
            return f"it is the copy {move.kind} {move.uuid} ({move.status}) builds"
        returns = move.status in ("finished", "reverting") and token == move.source_token
        if move.kind in states.COLD and move.source == node and returns:
            return f"a revert of migration {move.uuid} ({move.status}) returns to it"
    return None


class Observer:
    """Checks the invariants for a :class:`World`; remembers what it saw between steps."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.last_transition = 0
        self.api_errors: list[str] = []
        #: Servers an admin reset (os-resetState) since the last check: any state of theirs
        #: may become ACTIVE or ERROR with no task, as the admin asked.
        self.reset: set[UUID] = set()
        #: Every server, in the order created, as of the last check.
        self.servers: list[UUID] = []
        world.on_destroy = self.destroying

    async def destroying(self, host: Host, instance_uuid: UUID, token: UUID | None) -> None:
        async with self.world.db.acquire() as conn:
            node = await conn.fetchval(
                "SELECT id FROM compute_nodes WHERE uuid = $1", host.node_uuid
            )
            snap_row = await conn.fetchrow(
                "SELECT uuid, vm_state, task_state, compute_id, deleted_at IS NOT NULL AS d, "
                "copy_token FROM instances WHERE uuid = $1",
                instance_uuid,
            )
            moves = await conn.fetch(
                "SELECT uuid, instance_uuid, migration_type, status, source_compute_id, "
                "dest_compute_id, source_token FROM migrations "
                "WHERE instance_uuid = $1 AND deleted_at IS NULL ORDER BY id",
                instance_uuid,
            )
        row = None if snap_row is None else Row(*snap_row.values())
        why = protected(row, [Move(*m.values()) for m in moves], node, token)
        if why is not None:
            self.world.i3_violations.append(
                f"I3 host {host.name} destroyed its copy of server {instance_uuid}, but {why}"
            )

    def transition_problems(self, snap: Snapshot) -> list[str]:
        rows = snap.transitions
        if rows:
            self.last_transition = rows[-1]["id"]
        # What another transaction saw: the first old and the last new state of each
        # subject within one transaction.
        collapsed: dict[tuple[int, UUID], dict[str, Any]] = {}
        for r in rows:
            key = (r["tx"], r["subject"])
            if key in collapsed:
                for column in ("new_vm", "new_task", "new_node", "new_deleted", "new_status"):
                    collapsed[key][column] = r[column]
            else:
                collapsed[key] = dict(r)
        problems = []
        for t in collapsed.values():
            if t["kind"] == "migration":
                if not states.migration_allowed(t["mtype"], t["old_status"], t["new_status"]):
                    problems.append(
                        f"I5 {t['mtype']} {t['subject']}: {t['old_status']} → {t['new_status']}"
                    )
                continue
            old = (t["old_vm"], t["old_task"])
            new: states.State = (
                ("deleted", None) if t["new_deleted"] else (t["new_vm"], t["new_task"])
            )
            if t["old_deleted"]:
                old = ("deleted", None)
            if t["subject"] in self.reset and new in states.RESET and old != states.DELETED:
                continue
            if not states.instance_allowed(old, new):
                problems.append(f"I5 server {t['subject']}: {old} → {new}")
            elif (
                t["old_node"] != t["new_node"]
                and t["old_vm"] is not None
                and not states.node_change_allowed(
                    t["old_task"], t["new_task"], bool(t["new_deleted"])
                )
            ):
                problems.append(
                    f"I5 server {t['subject']} moved from node {t['old_node']} to "
                    f"{t['new_node']} in {old} → {new}"
                )
        return problems

    def message_problems(self) -> list[str]:
        broker = self.world.rt.broker
        problems = [
            f"I0 {dead.topic} message dead-lettered as poison: {dead.detail}"
            for dead in broker.dead_casts + broker.dead_calls
            # keel rejects a cast that kept failing for a transient reason "after N
            # deliveries" (lost work a deadline ends); anything else it rejects is poison.
            if dead.reason == "rejected" and dead.detail and not dead.detail.startswith("after ")
        ]
        return problems + self.api_errors

    async def after_step(self) -> list[str]:
        async with self.world.db.acquire() as conn:
            snap = await snapshot(conn, self.last_transition)
        problems = self.transition_problems(snap)
        self.reset.clear()
        self.servers = snap.order
        problems += claim_problems(snap)
        problems += running_problems(snap, self.world.hosts)
        problems += self.world.i3_violations
        return problems + self.message_problems()

    async def at_quiescence(self) -> list[str]:
        problems = await self.after_step()
        async with self.world.db.acquire() as conn:
            snap = await snapshot(conn, self.last_transition)
        problems += quiet_problems(snap, self.world.hosts)
        return problems


def adoption_problems(snap: Snapshot, hosts: list[Host]) -> list[str]:
    """I2 at quiescence, finding 2: the copy a server lives on carries its current copy
    token (the one its build or its last move made), never an older copy's."""
    problems = []
    node_host = {snap.node_ids.get(h.node_uuid): h for h in hosts if h.node_uuid}
    for row in snap.instances.values():
        host = node_host.get(row.node) if row.node is not None else None
        if row.deleted or host is None or host.gone:
            continue
        spec = host.driver.guest(row.uuid)
        if spec is None:
            continue
        if spec.origin != row.token:
            problems.append(
                f"I2 server {row.uuid} lives on a copy carrying {spec.origin}, not its "
                f"current copy token {row.token}: a stale copy was adopted"
            )
    return problems


def quiet_problems(snap: Snapshot, hosts: list[Host]) -> list[str]:
    """I1, I2 and I4 once everything was delivered, every deadline passed and swept."""
    problems = adoption_problems(snap, hosts)
    if snap.unfinished_images:
        problems.append(
            f"I4 {snap.unfinished_images} snapshot image(s) still wait for data that never "
            "comes (a snapshot that ended, or its server gone, left its image behind)"
        )
    node_host = {snap.node_ids.get(h.node_uuid): h for h in hosts if h.node_uuid}
    for move in snap.moves:
        # An evacuation away from a host deleted for good stays done: no agent is left to
        # confirm it (docs/fencing.md, "a host that died for good").
        gone = (
            move.kind == "evacuation" and move.status == "done" and move.source in snap.gone_nodes
        )
        if move.status not in states.TERMINAL and not gone:
            problems.append(f"I4 {move.kind} {move.uuid} of {move.instance} is still {move.status}")
    copies: dict[UUID, set[int]] = {}
    for node, host in node_host.items():
        if host.gone or node is None:
            continue
        for guest in host.driver.guests():
            if (node, guest) not in snap.orphans:
                copies.setdefault(guest, set()).add(node)
    for row in snap.instances.values():
        own = [c for c in snap.claims if c.instance == row.uuid]
        where = copies.get(row.uuid, set())
        if row.deleted:
            if own:
                problems.append(
                    f"I1 deleted server {row.uuid} holds claims on {[c.node for c in own]}"
                )
            if where:
                problems.append(f"I2 deleted server {row.uuid} still has copies on nodes {where}")
            continue
        if row.task is not None or row.vm == "building":
            problems.append(f"I4 server {row.uuid} is still {row.vm}/{row.task}")
        if any(c.consumer != row.uuid for c in own):
            problems.append(f"I1 server {row.uuid} still holds a move's claim")
        nodes = {c.node for c in own}
        expected = set() if row.node is None else {row.node}
        unclaimed = where - nodes
        if unclaimed:
            # A copy uses its host's resources: whatever the server's state, it holds a claim
            # there (a build that finished after its deadline, say).
            problems.append(f"I1 server {row.uuid} ({row.vm}) has copies on {unclaimed} unclaimed")
        if row.vm == "error":
            if not nodes <= expected:
                problems.append(
                    f"I1 server {row.uuid} in ERROR holds claims on {nodes}, node {row.node}"
                )
            if not where <= expected:
                problems.append(
                    f"I2 server {row.uuid} in ERROR has copies on {where}, node {row.node}"
                )
            continue
        if nodes != expected or len(own) != len(expected):
            problems.append(
                f"I1 server {row.uuid} on node {row.node} holds claims on {sorted(nodes)}"
            )
        if where != expected and not (row.node in node_host and node_host[row.node].gone):
            problems.append(
                f"I2 server {row.uuid} on node {row.node} has copies on {sorted(where)}"
            )
    return problems
