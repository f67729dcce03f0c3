"""What the database knows about a compute agent's host and node: resolved before any write.

An agent asks (``resolve_compute``) before it creates an identity file, and registration
asks again inside its transaction. Each check either resolves the node the agent is to
run as, or refuses with an :class:`~shared.exceptions.IdentityRefused` error whose message
says what happened and what to do. Nothing here writes to the database.

* The node UUID belongs to a service on another host: a possible rename.
* The node UUID was deleted by an operator: it is never revived.
* No identity file, but the host registered before: the identity was lost — unless the
  host's service row was last written by a release that kept no identity file and the
  host has exactly one node, which is adopted (an upgrade).
* An unknown node UUID for a host that already has a node: a duplicate node record.
* A host new to the database whose hypervisor already holds servers under another host.
"""

from __future__ import annotations

import logging

from services.conductor.rpcapi import ComputeResolution, ResolveCompute
from shared.db import compute_nodes, placement, services
from shared.db.pool import Connection
from shared.exceptions import (
    ComputeNodeDeleted,
    DuplicateComputeNode,
    HostRenameDetected,
    HypervisorInUse,
    IdentityLost,
    ServiceNotFound,
)
from shared.objects.compute_node import ComputeNode
from shared.objects.service import Service
from shared.versions import STABLE_IDENTITY_VERSION

LOG = logging.getLogger(__name__)

UNCHANGED = "Nothing was changed."


async def resolve(conn: Connection, req: ResolveCompute, down_time: float) -> ComputeResolution:
    """Resolve the agent's node, or raise the refusal that explains why it may not start."""
    if req.node_uuid is not None:
        node = await compute_nodes.find_by_uuid(conn, req.node_uuid)
        if node is not None:
            return await _known_node(conn, req, node, down_time)
    service = await services.find_compute(conn, req.host, down_time)
    if service is None:
        await _check_hypervisor_free(conn, req)
        return ComputeResolution(
            decision="new",
            node_uuid=req.node_uuid,
            reason=f"host {req.host!r} is new to the database",
        )
    nodes = await compute_nodes.of_service(conn, service.id)
    if not nodes:
        # Also the case of a registration, which writes the host's service row first.
        await _check_hypervisor_free(conn, req)
        return ComputeResolution(
            decision="new", node_uuid=req.node_uuid, reason=f"host {req.host!r} has no node yet"
        )
    if req.node_uuid is not None:
        raise _duplicate(req, service, nodes)
    if service.version < STABLE_IDENTITY_VERSION and len(nodes) == 1:
        return ComputeResolution(
            decision="adopt",
            node_uuid=nodes[0].uuid,
            reason=(
                f"host {req.host!r} was last registered by service version {service.version}, "
                "which kept no identity file, and has exactly one node"
            ),
        )
    raise _lost(req, service, nodes)


async def _known_node(
    conn: Connection, req: ResolveCompute, node: ComputeNode, down_time: float
) -> ComputeResolution:
    if node.deleted_at is not None:
        raise ComputeNodeDeleted(
            f"compute node {node.uuid} (host {node.host!r}) was deleted by an operator "
            f"(`openstack compute service delete`); its UUID is never used again. {UNCHANGED} "
            f"To start this host as a new compute node, remove its identity file "
            f"({req.identity_file}, and any copy beside the --config file), then start the "
            "agent again."
        )
    owner = await _service_host(conn, node, down_time)
    if owner != req.host:
        raise await _renamed(conn, req, node, owner)
    return ComputeResolution(
        decision="known", node_uuid=node.uuid, reason=f"node {node.uuid} belongs to host {owner!r}"
    )


async def _service_host(conn: Connection, node: ComputeNode, down_time: float) -> str:
    """The host of the node's service (the node's own copy if it has no service link)."""
    if node.service_id is None:
        return node.host
    try:
        return (await services.get_by_id(conn, node.service_id, down_time)).host
    except ServiceNotFound:
        return node.host


async def _renamed(
    conn: Connection, req: ResolveCompute, node: ComputeNode, owner: str
) -> HostRenameDetected:
    servers = await placement.count_on(conn, [node.id])
    return HostRenameDetected(
        f"Possible rename detected: compute node {node.uuid} (from {req.identity_file}) "
        f"belongs to host {owner!r}, which has {servers} server(s), but this agent's host "
        f"is {req.host!r}. {UNCHANGED} If the host name changed by accident, set KEEL_HOST "
        f"back to {owner!r}. To rename the host on purpose, stop its agent and run "
        f"`keel-manage service rename {owner} {req.host}`, then start the agent again. If "
        "this is another machine, give it its own state directory."
    )


def _duplicate(req: ResolveCompute, service: Service, nodes: list[ComputeNode]) -> Exception:
    known = ", ".join(f"{n.uuid} (hypervisor {n.hypervisor_hostname!r})" for n in nodes)
    return DuplicateComputeNode(
        f"duplicate compute node: host {req.host!r} already has compute node {known}, but "
        f"this agent presents node UUID {req.node_uuid} from {req.identity_file}. {UNCHANGED} "
        f"If the identity file was replaced, put {nodes[0].uuid} back in it. If another "
        f"agent runs with KEEL_HOST={req.host}, give this one a host name of its own. If that "
        f"node is gone for good and hosts no servers, delete its service first (`openstack "
        f"compute service delete {service.uuid}`), then start the agent again."
    )


def _lost(req: ResolveCompute, service: Service, nodes: list[ComputeNode]) -> Exception:
    known = ", ".join(f"{n.uuid} (hypervisor {n.hypervisor_hostname!r})" for n in nodes)
    return IdentityLost(
        f"identity lost: host {req.host!r} has registered before as compute node {known}, "
        f"but this agent has no node identity file ({req.identity_file}). {UNCHANGED} "
        f"Restore it: `echo {nodes[0].uuid} > {req.identity_file}`, then start the agent "
        f"again. If this host's servers are gone for good, delete its service instead "
        f"(`openstack compute service delete {service.uuid}`) and start as a new node."
    )


async def _check_hypervisor_free(conn: Connection, req: ResolveCompute) -> None:
    """Refuse a new host whose hypervisor holds servers recorded under another host."""
    rows = await conn.fetch(
        """SELECT host, count(*) AS servers FROM instances
            WHERE deleted_at IS NULL AND node = $1 AND host IS DISTINCT FROM $2
              AND host IS NOT NULL
            GROUP BY host ORDER BY host""",
        req.hypervisor_hostname,
        req.host,
    )
    if not rows:
        return
    held = ", ".join(f"{row['servers']} under host {row['host']!r}" for row in rows)
    first = rows[0]["host"]
    raise HypervisorInUse(
        f"host {req.host!r} is new, but its hypervisor {req.hypervisor_hostname!r} already "
        f"holds servers: {held}. {UNCHANGED} If this machine was host {first!r}, restore "
        f"that host's node identity file and either set KEEL_HOST back to {first!r} or "
        f"rename it (`keel-manage service rename {first} {req.host}` while its agent is "
        "stopped). If it is another machine, give its hypervisor another name "
        "(KEEL_COMPUTE__HYPERVISOR_HOSTNAME)."
    )
