"""What the agent's tests stand on: a stand-in conductor, instance specs, waiting.

:class:`StandInConductor` serves the conductor's RPC API on topic ``conductor`` the way
the real one answers agents, and records what it was sent, so a test can assert what an
agent reported. It refuses a node resolving or registering from another host, as the
real conductor does, with :class:`~shared.exceptions.HostRenameDetected`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from services.compute.rpcapi import InstanceSpec
from services.conductor import rpcapi as conductor_rpcapi
from services.conductor.rpcapi import (
    BuildCheck,
    BuildVerdict,
    CheckBuild,
    CheckMove,
    ComputeResolution,
    CopyRemoved,
    EvacuationConfirmed,
    GuestFate,
    GuestsReport,
    GuestVerdict,
    InstanceActionResult,
    InstanceBuildResult,
    InstanceDeleted,
    MoveResult,
    RegisterCompute,
    Registration,
    ReportGuests,
    RequestTaken,
    ResolveCompute,
    ServiceHeartbeat,
    TakeRequest,
)
from shared.context import RequestContext
from shared.exceptions import HostRenameDetected, ServiceNotFound, TransientError
from shared.objects.flavor import FlavorSnapshot
from shared.rpc.server import RPCServer
from shared.rpc.transport import Transport


@dataclass(frozen=True)
class Node:
    host: str
    service_uuid: UUID
    service_id: int
    node_id: int


class StandInConductor:
    """The conductor's agent-facing RPC methods, answered from memory."""

    def __init__(self) -> None:
        self.nodes: dict[UUID, Node] = {}
        self.resolutions: list[ResolveCompute] = []
        #: What ``resolve_compute`` answers for an agent without an identity file, if set.
        self.answer_without_file: ComputeResolution | None = None
        self.registrations: list[RegisterCompute] = []
        self.heartbeats: list[ServiceHeartbeat] = []
        self.build_results: list[InstanceBuildResult] = []
        self.deleted: list[UUID] = []
        self.action_results: list[InstanceActionResult] = []
        #: Services an operator deleted: their heartbeats are refused.
        self.deleted_services: set[UUID] = set()
        #: What ``check_build`` answers per instance (``build`` unless set); each answer
        #: is taken in turn, the last one repeated.
        self.verdicts: dict[UUID, list[BuildVerdict]] = {}
        self.checks: list[CheckBuild] = []
        #: What ``check_move`` answers per move (``build`` unless set), taken in turn.
        self.move_verdicts: dict[UUID, list[BuildVerdict]] = {}
        self.move_checks: list[CheckMove] = []
        #: Set, the next ``check_move`` fails as a conductor whose database is down does.
        self.move_check_fails = False
        #: What report_guests answers: a fate per guest (keep unless set), and the
        #: evacuations to confirm.
        self.fates: dict[UUID, GuestFate] = {}
        self.confirmations: list[GuestVerdict] = []
        self.reports: list[ReportGuests] = []
        self.confirmed: list[UUID] = []
        self.move_results: list[MoveResult] = []
        #: The migration a ``moved`` (or other) verdict names, per guest.
        self.moves: dict[UUID, UUID] = {}
        self.copies_removed: list[CopyRemoved] = []
        #: Cleared, the stand-in stops answering heartbeats, guest reports and build
        #: checks (as a conductor cut off from the agent), until set again.
        self.answering = asyncio.Event()
        self.answering.set()
        #: (what, instance) of the answers it gave to those, in order.
        self.answered: list[tuple[str, UUID | None]] = []
        #: Requests keel-api withdrew: ``take_request`` answers no to them.
        self.withdrawn: set[str] = set()
        self.taken: list[TakeRequest] = []
        #: Set, ``take_request`` fails as a conductor whose database is down does.
        self.take_fails = False

    async def resolve_compute(self, ctx: RequestContext, req: ResolveCompute) -> ComputeResolution:
        self.resolutions.append(req)
        node = self.nodes.get(req.node_uuid) if req.node_uuid else None
        if req.node_uuid is None and self.answer_without_file is not None:
            return self.answer_without_file
        if node is None:
            return ComputeResolution(decision="new", node_uuid=req.node_uuid)
        if node.host != req.host:
            raise HostRenameDetected(
                f"compute node {req.node_uuid} belongs to host {node.host!r}, "
                f"not {req.host!r}; refusing to start"
            )
        return ComputeResolution(decision="known", node_uuid=req.node_uuid)

    async def register_compute(self, ctx: RequestContext, req: RegisterCompute) -> Registration:
        self.registrations.append(req)
        node = self.nodes.get(req.node_uuid)
        if node is None:
            number = len(self.nodes) + 1
            node = Node(req.host, uuid.uuid4(), service_id=number, node_id=number)
            self.nodes[req.node_uuid] = node
        elif node.host != req.host:
            raise HostRenameDetected(
                f"compute node {req.node_uuid} belongs to host {node.host!r}, "
                f"not {req.host!r}; refusing to start"
            )
        return Registration(
            service_uuid=node.service_uuid,
            service_id=node.service_id,
            node_uuid=req.node_uuid,
            node_id=node.node_id,
        )

    async def _answer(self, what: str, instance_uuid: UUID | None = None) -> None:
        await self.answering.wait()
        self.answered.append((what, instance_uuid))

    async def service_heartbeat(self, ctx: RequestContext, req: ServiceHeartbeat) -> None:
        await self._answer("heartbeat")
        self.heartbeats.append(req)
        if req.service_uuid in self.deleted_services:
            raise ServiceNotFound(f"service {req.service_uuid} does not exist or was deleted")

    async def instance_build_result(self, ctx: RequestContext, req: InstanceBuildResult) -> None:
        self.build_results.append(req)

    async def take_request(self, ctx: RequestContext, req: TakeRequest) -> RequestTaken:
        self.taken.append(req)
        if self.take_fails:
            raise TransientError("the database cannot be reached (test)")
        return RequestTaken(proceed=req.request_id not in self.withdrawn)

    async def instance_deleted(self, ctx: RequestContext, req: InstanceDeleted) -> None:
        self.deleted.append(req.instance_uuid)

    async def instance_action_result(self, ctx: RequestContext, req: InstanceActionResult) -> None:
        self.action_results.append(req)

    async def report_guests(self, ctx: RequestContext, req: ReportGuests) -> GuestsReport:
        """Every guest stays unless a test says otherwise (``fates``/``confirmations``)."""
        await self._answer("report")
        self.reports.append(req)
        verdicts = [
            GuestVerdict(
                instance_uuid=guest,
                fate=self.fates.get(guest, GuestFate.KEEP),
                migration_uuid=self.moves.get(guest),
            )
            for guest in req.guests
        ]
        return GuestsReport(verdicts=verdicts, to_confirm=list(self.confirmations))

    async def evacuation_confirmed(self, ctx: RequestContext, req: EvacuationConfirmed) -> None:
        self.confirmed.append(req.migration_uuid)
        self.confirmations = [
            v for v in self.confirmations if v.migration_uuid != req.migration_uuid
        ]

    async def move_result(self, ctx: RequestContext, req: MoveResult) -> None:
        self.move_results.append(req)

    async def copy_removed(self, ctx: RequestContext, req: CopyRemoved) -> None:
        self.copies_removed.append(req)

    async def check_build(self, ctx: RequestContext, req: CheckBuild) -> BuildCheck:
        await self._answer("check_build", req.instance_uuid)
        self.checks.append(req)
        answers = self.verdicts.get(req.instance_uuid, [BuildVerdict.BUILD])
        verdict = answers.pop(0) if len(answers) > 1 else answers[0]
        return BuildCheck(verdict=verdict, reason=f"the stand-in says {verdict.value}")

    async def check_move(self, ctx: RequestContext, req: CheckMove) -> BuildCheck:
        self.move_checks.append(req)
        if self.move_check_fails:
            self.move_check_fails = False
            raise TransientError("the database cannot be reached (test)")
        answers = self.move_verdicts.get(req.migration_uuid, [BuildVerdict.BUILD])
        verdict = answers.pop(0) if len(answers) > 1 else answers[0]
        return BuildCheck(verdict=verdict, reason=f"the stand-in says {verdict.value}")

    def results_for(self, instance_uuid: UUID) -> list[InstanceBuildResult]:
        return [r for r in self.build_results if r.instance_uuid == instance_uuid]


async def serve_standin(
    transport: Transport, standin: StandInConductor, version: str = conductor_rpcapi.RPC_VERSION
) -> RPCServer:
    """Serve ``standin`` on topic ``conductor`` of a connected transport, at ``version``."""
    server = RPCServer(transport, conductor_rpcapi.TOPIC, standin, version=version)
    await server.start(prefetch=8)
    return server


def make_spec(*, root_gb: int = 1, node: str = "host1", name: str = "vm") -> InstanceSpec:
    return InstanceSpec(
        uuid=uuid.uuid4(),
        display_name=name,
        flavor=FlavorSnapshot(
            flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=root_gb
        ),
        image_ref="cirros",
        node=node,
    )


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds; fail the test if it never does."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                if predicate():
                    return
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"condition not met within {timeout:g}s") from None
