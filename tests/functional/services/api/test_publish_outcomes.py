"""202 means it will happen, 503 that nothing will: casts whose outcome is unknown.

keel-api's clients are replaced by ones whose casts fail as a dropped connection makes
them fail (``MessagingTimeout``: the frame may or may not have reached the broker), and
which, in the "taken" cases, first do what the receiver would have done. The database is
real.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.api.servers import publish
from services.compute.rpcapi import ComputeAPI, InstanceSpec, ShelveInstance, SnapshotInstance
from services.conductor import instance_events
from services.conductor.rpcapi import ConductorAPI, CopyToken, InstanceBuildResult
from shared.config import Settings
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances
from shared.exceptions import MessagingTimeout
from shared.objects.instance import RequestedDestination
from shared.objects.states import PowerState, TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from shared.versions import SERVICE_VERSION
from tests.functional.services.api.conftest import ADMIN, IMAGE_ID, add_compute, add_image
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

LOST = "the connection closed before the broker confirmed the message"


class LosingConductor(ConductorAPI):
    """Every build cast is lost; with ``taken``, a conductor placed the server first."""

    def __init__(self, transport: AmqpTransport, pool: asyncpg.Pool, *, taken: bool) -> None:
        super().__init__(transport)
        self.pool = pool
        self.taken = taken
        self.attempts = 0

    async def build_instances(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        requested_destination: RequestedDestination | None = None,
    ) -> None:
        self.attempts += 1
        if self.taken:
            async with self.pool.acquire() as conn:
                node = await compute_nodes.get_by_id(
                    conn, await conn.fetchval("SELECT min(id) FROM compute_nodes")
                )
                await instances.set_scheduled(
                    conn,
                    instance_uuid,
                    host=node.host,
                    node=node.hypervisor_hostname,
                    compute_id=node.id,
                )
        raise MessagingTimeout(LOST)


class LosingCompute(ComputeAPI):
    """Every power and delete cast is lost; with ``taken``, the agent finished it first."""

    def __init__(self, transport: AmqpTransport, pool: asyncpg.Pool, *, taken: bool) -> None:
        super().__init__(transport)
        self.pool = pool
        self.taken = taken
        self.attempts = 0

    async def stop_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        self.attempts += 1
        if self.taken:
            async with self.pool.acquire() as conn:
                await instances.finish_task(
                    conn,
                    instance_uuid,
                    (TaskState.POWERING_OFF,),
                    vm_state=VmState.STOPPED,
                    power_state=PowerState.SHUTDOWN,
                )
        raise MessagingTimeout(LOST)

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        self.attempts += 1
        raise MessagingTimeout(LOST)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "PAUSE", 0.01)


@pytest.fixture
async def api(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> AsyncIterator[tuple[httpx.AsyncClient, LosingConductor, LosingCompute]]:
    conductor = LosingConductor(transport, db_pool, taken=False)
    compute = LosingCompute(transport, db_pool, taken=False)
    app = create_app(settings, db_pool, conductor, compute)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http, conductor, compute


async def _active_server(
    client: httpx.AsyncClient, pool: asyncpg.Pool, conductor: LosingConductor
) -> UUID:
    conductor.taken = True
    created = await client.post("/v2.1/servers", headers=ADMIN, json=server_body())
    assert created.status_code == 202, created.text
    server = UUID(created.json()["server"]["id"])
    async with pool.acquire() as conn:
        await instances.set_active(conn, server)
    return server


async def _active_server_on(
    client: httpx.AsyncClient, pool: asyncpg.Pool, conductor: LosingConductor, host: str
) -> UUID:
    """An ACTIVE server on ``host``, an agent that takes requests."""
    await add_image(pool)
    await add_compute(pool, host)
    await takes_requests(pool, host)
    return await _active_server(client, pool, conductor)


async def test_a_create_that_cannot_be_sent_is_503_and_withdrawn(
    api: tuple[httpx.AsyncClient, LosingConductor, LosingCompute], db_pool: asyncpg.Pool
) -> None:
    client, conductor, _ = api
    await add_image(db_pool)
    await add_compute(db_pool, "pub-a")
    await takes_requests(db_pool, "pub-a")

    response = await client.post("/v2.1/servers", headers=ADMIN, json=server_body())

    assert response.status_code == 503, response.text
    assert conductor.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        left = await conn.fetchval("SELECT count(*) FROM instances WHERE deleted_at IS NULL")
        claims = await conn.fetchval("SELECT count(*) FROM allocations")
    assert (left, claims) == (0, 0)


async def test_a_create_a_conductor_already_took_is_202_and_goes_on(
    api: tuple[httpx.AsyncClient, LosingConductor, LosingCompute], db_pool: asyncpg.Pool
) -> None:
    client, conductor, _ = api
    await add_image(db_pool)
    await add_compute(db_pool, "pub-b")
    await takes_requests(db_pool, "pub-b")
    conductor.taken = True

    response = await client.post("/v2.1/servers", headers=ADMIN, json=server_body())

    assert response.status_code == 202, response.text
    async with db_pool.acquire() as conn:
        server = await instances.get(conn, UUID(response.json()["server"]["id"]))
    assert server.deleted_at is None
    assert server.host == "pub-b"


async def takes_requests(pool: asyncpg.Pool, host: str) -> None:
    """The host's agent runs a release that takes keel-api's requests before acting: only
    such an agent's requests may be withdrawn (an older one acts on whatever arrives)."""
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET version = $2 WHERE host = $1 AND "binary" = 'keel-compute'""",
            host,
            SERVICE_VERSION,
        )


@asynccontextmanager
async def serving(
    settings: Settings,
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    host: str,
    *,
    api_pool: object | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of keel-api over these RPC clients, with the image and a compute ``host``
    whose agent takes requests; keel-api's pool is ``api_pool`` if given (an outage)."""
    await add_image(pool)
    await add_compute(pool, host)
    await takes_requests(pool, host)
    app = create_app(settings, cast("asyncpg.Pool", api_pool or pool), conductor, compute)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as client:
        yield client


async def test_an_older_agents_request_is_never_withdrawn_a_stop_is_202(
    api: tuple[httpx.AsyncClient, LosingConductor, LosingCompute], db_pool: asyncpg.Pool
) -> None:
    """Finding 19: an agent of a release before requests were taken may act on the
    unconfirmed message: keel-api answers 202 and leaves the task to the agent."""
    client, conductor, _ = api
    await add_image(db_pool)
    await add_compute(db_pool, "pub-old")
    server = await _active_server(client, db_pool, conductor)

    response = await client.post(
        f"/v2.1/servers/{server}/action", headers=ADMIN, json={"os-stop": None}
    )

    assert response.status_code == 202, response.text
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
    assert shown.task_state == "powering-off"


async def test_a_stop_that_cannot_be_sent_is_503_and_its_task_cleared(
    api: tuple[httpx.AsyncClient, LosingConductor, LosingCompute], db_pool: asyncpg.Pool
) -> None:
    client, conductor, compute = api
    await add_image(db_pool)
    await add_compute(db_pool, "pub-c")
    await takes_requests(db_pool, "pub-c")
    server = await _active_server(client, db_pool, conductor)

    response = await client.post(
        f"/v2.1/servers/{server}/action", headers=ADMIN, json={"os-stop": None}
    )

    assert response.status_code == 503, response.text
    assert compute.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
    assert (shown.vm_state, shown.task_state) == (VmState.ACTIVE, None)


async def test_a_stop_its_agent_already_finished_is_202(
    api: tuple[httpx.AsyncClient, LosingConductor, LosingCompute], db_pool: asyncpg.Pool
) -> None:
    client, conductor, compute = api
    await add_image(db_pool)
    await add_compute(db_pool, "pub-d")
    await takes_requests(db_pool, "pub-d")
    server = await _active_server(client, db_pool, conductor)
    compute.taken = True

    response = await client.post(
        f"/v2.1/servers/{server}/action", headers=ADMIN, json={"os-stop": None}
    )

    assert response.status_code == 202, response.text
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
    assert (shown.vm_state, shown.task_state) == (VmState.STOPPED, None)


class MarkedMeanwhileCompute(LosingCompute):
    """Every stop cast is lost, and while the first is on its way a delete of the same
    server marks it ``deleting`` (over the stop's ``powering-off``) and records itself."""

    async def stop_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        if self.attempts == 0:
            async with self.pool.acquire() as conn, conn.transaction():
                await instances.mark_deleting(conn, instance_uuid)
                await instance_actions.start(
                    conn, RequestContext(user_id="other"), instance_uuid, "delete"
                )
        await super().stop_instance(ctx, service_uuid, instance_uuid)


async def test_a_stop_that_cannot_be_sent_under_a_deletes_mark_is_503_and_withdrawn(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    """A stop whose every cast failed while a delete marked its server: the stop was
    answered 202 (its task gone, it looked taken) though nothing was sent. It is 503 and
    withdrawn now; the delete's mark stays."""
    conductor = LosingConductor(transport, db_pool, taken=False)
    compute = MarkedMeanwhileCompute(transport, db_pool, taken=False)
    async with serving(settings, db_pool, conductor, compute, "pub-m") as client:
        server = await _active_server(client, db_pool, conductor)

        response = await client.post(
            f"/v2.1/servers/{server}/action", headers=ADMIN, json={"os-stop": None}
        )

    assert response.status_code == 503, response.text
    assert compute.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
        withdrawn = await conn.fetchval(
            """SELECT withdrawn_at IS NOT NULL FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'stop'""",
            server,
        )
    assert (shown.vm_state, shown.task_state) == (VmState.ACTIVE, TaskState.DELETING)
    assert withdrawn


async def test_a_delete_that_cannot_be_sent_is_503_and_the_server_unchanged(
    api: tuple[httpx.AsyncClient, LosingConductor, LosingCompute], db_pool: asyncpg.Pool
) -> None:
    client, conductor, compute = api
    server = await _active_server_on(client, db_pool, conductor, "pub-e")

    response = await client.delete(f"/v2.1/servers/{server}", headers=ADMIN)

    assert response.status_code == 503, response.text
    assert compute.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
    assert (shown.vm_state, shown.task_state, shown.deleted_at) == (VmState.ACTIVE, None, None)


async def test_a_delete_that_cannot_be_sent_leaves_an_earlier_deletes_task(
    api: tuple[httpx.AsyncClient, LosingConductor, LosingCompute], db_pool: asyncpg.Pool
) -> None:
    """A server already ``deleting`` (an earlier delete answered 204, its terminate on its
    way): a second delete that cannot be sent is withdrawn (503) and leaves the task for
    the earlier one, whose agent then deletes the server (finding 37)."""
    client, conductor, compute = api
    server = await _active_server_on(client, db_pool, conductor, "pub-f")
    async with db_pool.acquire() as conn:
        await instances.set_task_state(conn, server, TaskState.DELETING)

    response = await client.delete(f"/v2.1/servers/{server}", headers=ADMIN)

    assert response.status_code == 503, response.text
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
        withdrawn = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'delete' AND withdrawn_at IS NOT NULL""",
            server,
        )
    assert compute.attempts == publish.ATTEMPTS
    assert (shown.vm_state, shown.task_state) == (VmState.ACTIVE, TaskState.DELETING)
    assert withdrawn == 1


class RacedCompute(LosingCompute):
    """Every delete cast is lost, and while the first is on its way another delete of the
    same server marks it ``deleting`` and records itself, as one sent beside it would."""

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        if self.attempts == 0:
            async with self.pool.acquire() as conn, conn.transaction():
                await instances.set_task_state(conn, instance_uuid, TaskState.DELETING)
                await instance_actions.start(
                    conn, RequestContext(user_id="other"), instance_uuid, "delete"
                )
        await super().terminate_instance(ctx, service_uuid, instance_uuid)


async def test_a_delete_that_cannot_be_sent_leaves_the_mark_of_another_under_way(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    """Finding 39: two deletes begun from the same state; the one that could not be sent
    is withdrawn (503) and leaves the ``deleting`` mark of the other, which was sent."""
    conductor = LosingConductor(transport, db_pool, taken=False)
    compute = RacedCompute(transport, db_pool, taken=False)
    async with serving(settings, db_pool, conductor, compute, "pub-g") as client:
        server = await _active_server(client, db_pool, conductor)

        response = await client.delete(f"/v2.1/servers/{server}", headers=ADMIN)

    assert response.status_code == 503, response.text
    assert compute.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
        live = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'delete' AND withdrawn_at IS NULL""",
            server,
        )
    assert (shown.vm_state, shown.task_state) == (VmState.ACTIVE, TaskState.DELETING)
    assert live == 1


async def test_a_delete_that_cannot_be_sent_gives_a_soft_delete_its_mark_back(
    api: tuple[httpx.AsyncClient, LosingConductor, LosingCompute], db_pool: asyncpg.Pool
) -> None:
    """Finding 43: a server being soft-deleted (its soft delete recorded as a delete, on
    its way); a force-delete that cannot be sent is withdrawn (503) and puts
    ``soft-deleting`` back, so the soft delete goes on."""
    client, conductor, compute = api
    server = await _active_server_on(client, db_pool, conductor, "pub-h")
    async with db_pool.acquire() as conn:
        await instances.set_task_state(conn, server, TaskState.SOFT_DELETING)
        await instance_actions.start(conn, RequestContext(user_id="u"), server, "delete")

    response = await client.post(
        f"/v2.1/servers/{server}/action", headers=ADMIN, json={"forceDelete": None}
    )

    assert response.status_code == 503, response.text
    assert compute.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
    assert (shown.vm_state, shown.task_state) == (VmState.ACTIVE, TaskState.SOFT_DELETING)


class EndedMeanwhileCompute(LosingCompute):
    """Every delete cast is lost, and while the first is on its way the request that
    began the server's task goes: a move withdrawn for its own lost cast (its record
    ended), or a soft delete withdrawn the same way."""

    def __init__(self, transport: AmqpTransport, pool: asyncpg.Pool, action: str, how: str) -> None:
        super().__init__(transport, pool, taken=False)
        self.action, self.how = action, how

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        if self.attempts == 0:
            async with self.pool.acquire() as conn:
                if self.how == "ended":
                    await instance_actions.finish(conn, instance_uuid, self.action, LOST)
                else:
                    await instance_actions.withdraw(conn, instance_uuid, "earlier", LOST)
        await super().terminate_instance(ctx, service_uuid, instance_uuid)


@pytest.mark.parametrize(
    "gone",
    [
        (TaskState.RESIZE_PREP, "migrate", "ended"),
        (TaskState.SOFT_DELETING, "delete", "withdrawn"),
    ],
    ids=["a-move-ended", "a-soft-delete-withdrawn"],
)
async def test_a_delete_that_cannot_be_sent_gives_no_task_back_to_a_request_gone_meanwhile(
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    gone: tuple[TaskState, str, str],
) -> None:
    """Finding 51: a force-delete marks a server whose task another request began (a
    migration, a soft delete); that request could not be sent either and went while the
    mark stood. The force-delete, withdrawn (503), leaves the server with no task: the
    one it found belongs to nobody now."""
    task, action, how = gone
    conductor = LosingConductor(transport, db_pool, taken=False)
    compute = EndedMeanwhileCompute(transport, db_pool, action, how)
    async with serving(settings, db_pool, conductor, compute, f"pub-{how}") as client:
        server = await _active_server(client, db_pool, conductor)
        async with db_pool.acquire() as conn:
            await instance_actions.finish(conn, server, "create")  # its build is over
            await instances.set_task_state(conn, server, task)
            await instance_actions.start(
                conn, RequestContext(user_id="u", request_id="earlier"), server, action
            )

        response = await client.post(
            f"/v2.1/servers/{server}/action", headers=ADMIN, json={"forceDelete": None}
        )

    assert response.status_code == 503, response.text
    assert compute.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
    assert (shown.vm_state, shown.task_state) == (VmState.ACTIVE, None)


class BuiltMeanwhileCompute(LosingCompute):
    """Every delete cast is lost, and while the first is on its way the server's build
    ends: its agent's result (for the server's copy) reaches the conductor."""

    recorded: object = None

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        if self.attempts == 0:
            async with self.pool.acquire() as conn:
                token = (await instances.get(conn, instance_uuid)).copy_token
            built = InstanceBuildResult(
                instance_uuid=instance_uuid, success=True, built=CopyToken(token=token)
            )
            self.recorded = await instance_events.record_build_result(self.pool, built)
        await super().terminate_instance(ctx, service_uuid, instance_uuid)


async def test_a_delete_that_cannot_be_sent_leaves_a_server_built_meanwhile_active(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    """Finding 44: a delete of a server still building; its build ends while the delete
    is on its way, and the delete, never sent, is withdrawn (503). The build's result is
    recorded, not dropped for the ``deleting`` mark: the server is ACTIVE, with no task
    (its spawn is over) and its claim, since its guest runs."""
    conductor = LosingConductor(transport, db_pool, taken=True)
    compute = BuiltMeanwhileCompute(transport, db_pool, taken=False)
    async with serving(settings, db_pool, conductor, compute, "pub-i") as client:
        created = await client.post("/v2.1/servers", headers=ADMIN, json=server_body())
        assert created.status_code == 202, created.text
        server = UUID(created.json()["server"]["id"])
        async with db_pool.acquire() as conn:
            building = await instances.get(conn, server)
        assert (building.vm_state, building.task_state) == (VmState.BUILDING, TaskState.SPAWNING)

        response = await client.delete(f"/v2.1/servers/{server}", headers=ADMIN)

    assert response.status_code == 503, response.text
    assert compute.attempts == publish.ATTEMPTS
    assert compute.recorded is not None  # the conductor recorded the build's result
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
        created_result = await conn.fetchval(
            "SELECT result FROM instance_actions WHERE instance_uuid = $1 AND action = 'create'",
            server,
        )
    assert (shown.vm_state, shown.task_state) == (VmState.ACTIVE, None)
    assert shown.launched_at is not None
    assert created_result == "Success"


class GoesDown:
    """The test's pool, until ``down``: then every connection is refused (an outage)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.down = False

    def acquire(self, *, timeout: float | None = None) -> Any:
        if self.down:
            raise ConnectionRefusedError("the database cannot be reached (test)")
        return self.pool.acquire(timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


class LostThenOutage(LosingCompute):
    """Every delete cast goes out unconfirmed; after the last, the database goes down."""

    def __init__(self, transport: AmqpTransport, pool: asyncpg.Pool, outage: GoesDown) -> None:
        super().__init__(transport, pool, taken=False)
        self.outage = outage

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        if self.attempts == publish.ATTEMPTS - 1:
            self.outage.down = True
        await super().terminate_instance(ctx, service_uuid, instance_uuid)


async def test_a_delete_that_cannot_be_withdrawn_for_an_outage_is_204_and_stands(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    """Finding 49: every cast of a delete went out unconfirmed (it may have been sent),
    and the database went down before keel-api could withdraw it. 503 would say nothing
    happens, but the delete may reach its agent: keel-api answers 204, and the request
    stands, untaken and not withdrawn, for the conductors to send again."""
    outage = GoesDown(db_pool)
    conductor = LosingConductor(transport, db_pool, taken=False)
    compute = LostThenOutage(transport, db_pool, outage)
    async with serving(settings, db_pool, conductor, compute, "pub-j", api_pool=outage) as client:
        server = await _active_server(client, db_pool, conductor)

        response = await client.delete(f"/v2.1/servers/{server}", headers=ADMIN)

    assert response.status_code == 204, response.text
    assert compute.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
        standing = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'delete' AND withdrawn_at IS NULL
                  AND taken_at IS NULL AND finish_time IS NULL""",
            server,
        )
    assert (shown.vm_state, shown.task_state) == (VmState.ACTIVE, TaskState.DELETING)
    assert standing == 1


class OutageAfterLostCasts(LosingCompute):
    """Every rebuild, snapshot and shelve cast goes out unconfirmed; after the last, the
    database goes down."""

    def __init__(self, transport: AmqpTransport, pool: asyncpg.Pool, outage: GoesDown) -> None:
        super().__init__(transport, pool, taken=False)
        self.outage = outage

    async def _lost(self) -> None:
        self.attempts += 1
        if self.attempts == publish.ATTEMPTS:
            self.outage.down = True
        raise MessagingTimeout(LOST)

    async def rebuild_guest(
        self, ctx: RequestContext, service_uuid: UUID, spec: InstanceSpec, *, powered_off: bool
    ) -> None:
        await self._lost()

    async def snapshot_instance(
        self, ctx: RequestContext, service_uuid: UUID, req: SnapshotInstance
    ) -> None:
        await self._lost()

    async def shelve_instance(
        self, ctx: RequestContext, service_uuid: UUID, req: ShelveInstance
    ) -> None:
        await self._lost()


@pytest.mark.parametrize(
    ("body", "task"),
    [
        ({"rebuild": {"imageRef": str(IMAGE_ID)}}, TaskState.REBUILD_SPAWNING),
        ({"createImage": {"name": "snap"}}, TaskState.IMAGE_SNAPSHOT),
        ({"shelve": None}, TaskState.SHELVING),
    ],
    ids=["rebuild", "createImage", "shelve"],
)
async def test_a_request_that_cannot_be_withdrawn_for_an_outage_is_202_and_stands(
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    body: dict[str, Any],
    task: TaskState,
) -> None:
    """Finding 49's rule for rebuilds, snapshots and shelves: every cast went out
    unconfirmed (it may have been sent) and the database went down before keel-api
    could withdraw the request. It may reach its agent, so it is answered 202, not 503,
    and it stands, its task set, not withdrawn."""
    outage = GoesDown(db_pool)
    conductor = LosingConductor(transport, db_pool, taken=False)
    compute = OutageAfterLostCasts(transport, db_pool, outage)
    signing = settings.images.model_copy(update={"url_secret": "s" * 32})
    signed = settings.model_copy(update={"images": signing})
    host = f"pub-o-{next(iter(body))}"
    async with serving(signed, db_pool, conductor, compute, host, api_pool=outage) as client:
        server = await _active_server(client, db_pool, conductor)
        async with db_pool.acquire() as conn:  # its build claimed its node
            built = await instances.get(conn, server)
            assert built.compute_id is not None
            await allocations.claim(conn, built.compute_id, server, built.flavor)

        response = await client.post(f"/v2.1/servers/{server}/action", headers=ADMIN, json=body)

    assert response.status_code == 202, response.text
    assert compute.attempts == publish.ATTEMPTS
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
        withdrawn = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND withdrawn_at IS NOT NULL""",
            server,
        )
    assert shown.task_state == task
    assert withdrawn == 0
