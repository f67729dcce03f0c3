"""Shelve, offload and unshelve through the real conductor and scheduler: a stand-in
agent shelves, destroys and builds; every step is also run twice at once.

keel-api's part (the rows it writes before it casts) is done here as keel-api does it,
with :mod:`shared.db.shelves`.
"""

from __future__ import annotations

import asyncio
import uuid
from uuid import UUID

import asyncpg
import pytest

from services.compute.rpcapi import BuildAndRunInstance, ComputeAPI, GuestAction, ShelveInstance
from services.conductor import instance_events
from services.conductor.rpcapi import (
    BuildCheck,
    BuildVerdict,
    ConductorAPI,
    CopyToken,
    InstanceActionResult,
    InstanceBuildResult,
    PowerAction,
)
from services.conductor.shelving import ShelveDeadline, Shelving, UnshelveTask
from services.scheduler.rpcapi import SchedulerAPI
from shared.context import RequestContext
from shared.db import allocations, images, instance_actions, instances, request_specs, shelves
from shared.exceptions import MessagingTimeout
from shared.objects.instance import Instance
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import (
    StandInCompute,
    create_instance,
    eventually,
    register,
    serve_stand_in,
    until_active,
)

pytestmark = pytest.mark.functional

CTX = RequestContext(user_id="u", project_id="p")


class ShelvingCompute(StandInCompute):
    """A stand-in agent that shelves, offloads and unshelves as told, and reports back."""

    def __init__(self, conductor: ConductorAPI) -> None:
        super().__init__(conductor)
        self.shelved: list[ShelveInstance] = []
        self.offloaded: list[UUID] = []
        self.tokens: dict[UUID, UUID | None] = {}

    async def build_and_run_instance(self, ctx: RequestContext, req: BuildAndRunInstance) -> None:
        self.tokens[req.instance.uuid] = req.instance.origin
        check = await self.conductor.check_build(ctx, req.instance.uuid, self.node)
        assert isinstance(check, BuildCheck)
        if check.verdict is BuildVerdict.BUILD:
            await super().build_and_run_instance(ctx, req)

    async def shelve_instance(self, ctx: RequestContext, req: ShelveInstance) -> None:
        self.shelved.append(req)
        await self.conductor.instance_action_result(
            ctx, req.instance_uuid, PowerAction.SHELVE, success=True
        )

    async def shelve_offload_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        self.offloaded.append(req.instance_uuid)
        await self.conductor.instance_action_result(
            ctx, req.instance_uuid, PowerAction.SHELVE_OFFLOAD, success=True
        )

    node: UUID = uuid.uuid4()


async def get(pool: asyncpg.Pool, instance_uuid: UUID) -> Instance:
    async with pool.acquire() as conn:
        return await instances.get(conn, instance_uuid)


async def reaches(pool: asyncpg.Pool, instance_uuid: UUID, vm_state: str) -> Instance:
    async def check() -> Instance | None:
        found = await get(pool, instance_uuid)
        return found if found.vm_state == vm_state and found.task_state is None else None

    return await eventually(check)


async def shelve(pool: asyncpg.Pool, instance_uuid: UUID) -> UUID:
    """What keel-api records before it casts ``shelve_instance``."""
    image_id = uuid.uuid4()
    async with pool.acquire() as conn, conn.transaction():
        begun = await shelves.begin(
            conn,
            instance_uuid,
            image_id=image_id,
            name="vm-shelved",
            owner="p",
            disk_format="qcow2",
            min_disk=1,
            min_ram=0,
            properties={"instance_uuid": str(instance_uuid)},
        )
        assert begun is not None
        await instance_actions.start(conn, CTX, instance_uuid, "shelve")
    return image_id


async def actions(pool: asyncpg.Pool, instance_uuid: UUID) -> dict[str, tuple[str | None, int]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT action, result, count(*) OVER (PARTITION BY action) AS n
                 FROM instance_actions WHERE instance_uuid = $1""",
            instance_uuid,
        )
    return {row["action"]: (row["result"], row["n"]) for row in rows}


async def held(pool: asyncpg.Pool, instance_uuid: UUID) -> list[int]:
    async with pool.acquire() as conn:
        return [a.compute_node_id for a in await allocations.for_instance(conn, instance_uuid)]


async def active_server(
    pool: asyncpg.Pool, conductor: ConductorAPI, agent: ShelvingCompute
) -> UUID:
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(CTX, instance_uuid)
    await until_active(pool, instance_uuid)
    return instance_uuid


@pytest.mark.parametrize("protected", [False, True], ids=["unprotected", "protected"])
async def test_shelve_offloads_at_once_and_unshelve_builds_from_the_shelved_image(
    db_pool: asyncpg.Pool,
    conductor: ConductorAPI,
    agent_transport: AmqpTransport,
    *,
    protected: bool,
) -> None:
    """Unshelved, the server's shelved image is deleted; unless its owner protected it
    (Nova's deletion of it is refused by the Image API, and the unshelve goes on)."""
    first = await register(conductor, "shelf-a")
    agent = ShelvingCompute(conductor)
    agent.node = first.node_uuid
    await serve_stand_in(agent_transport, first, agent)
    instance_uuid = await active_server(db_pool, conductor, agent)
    built_with = (await get(db_pool, instance_uuid)).copy_token
    image_id = await shelve(db_pool, instance_uuid)

    # The agent's shelve result, delivered twice at once.
    result = InstanceActionResult(
        instance_uuid=instance_uuid, action=PowerAction.SHELVE, success=True
    )
    await asyncio.gather(
        conductor.client.cast(CTX, "instance_action_result", result, version="1.18"),
        conductor.client.cast(CTX, "instance_action_result", result, version="1.18"),
    )

    offloaded = await reaches(db_pool, instance_uuid, "shelved_offloaded")
    assert (offloaded.host, offloaded.node, offloaded.compute_id) == (None, None, None)
    assert offloaded.copy_token not in (None, built_with)
    assert offloaded.system_metadata[shelves.IMAGE_KEY] == str(image_id)
    assert offloaded.system_metadata[shelves.HOST_KEY] == "shelf-a"
    assert shelves.AT_KEY in offloaded.system_metadata
    assert await held(db_pool, instance_uuid) == []
    assert instance_uuid in agent.offloaded
    assert (await actions(db_pool, instance_uuid))["shelve"] == ("Success", 1)

    # The image is written (as the upload would); the unshelve is cast twice at once.
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE images SET status = 'active',
                      properties = properties || jsonb_build_object('protected', $2::bool)
                WHERE id = $1""",
            image_id,
            protected,
        )
        token = uuid.uuid4()
        assert await shelves.begin_unshelve(conn, instance_uuid, token) is not None
        await instance_actions.start(conn, CTX, instance_uuid, "unshelve")
    await asyncio.gather(
        conductor.unshelve_instance(CTX, instance_uuid),
        conductor.unshelve_instance(CTX, instance_uuid),
    )

    active = await reaches(db_pool, instance_uuid, "active")
    assert (active.host, active.copy_token) == ("shelf-a", token)
    assert active.system_metadata == {}
    assert len(await held(db_pool, instance_uuid)) == 1
    assert agent.built[-1].image_ref == str(image_id)
    assert agent.tokens[instance_uuid] == token
    async with db_pool.acquire() as conn:
        deleted = await conn.fetchval("SELECT deleted_at FROM images WHERE id = $1", image_id)
    assert (deleted is None) == protected
    assert (await actions(db_pool, instance_uuid))["unshelve"] == ("Success", 1)


async def test_no_valid_host_sends_an_unshelve_back_to_shelved_offloaded(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    host = await register(conductor, "shelf-full")
    agent = ShelvingCompute(conductor)
    agent.node = host.node_uuid
    await serve_stand_in(agent_transport, host, agent)
    instance_uuid = await active_server(db_pool, conductor, agent)
    image_id = await shelve(db_pool, instance_uuid)
    await conductor.instance_action_result(CTX, instance_uuid, PowerAction.SHELVE, success=True)
    await reaches(db_pool, instance_uuid, "shelved_offloaded")
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE images SET status = 'active' WHERE id = $1", image_id)
        # Only a zone no host is in will do.
        await request_specs.set_pinned_zone(conn, instance_uuid, "nowhere")
        assert await shelves.begin_unshelve(conn, instance_uuid, uuid.uuid4()) is not None
        await instance_actions.start(conn, CTX, instance_uuid, "unshelve")

    await asyncio.gather(
        conductor.unshelve_instance(CTX, instance_uuid),
        conductor.unshelve_instance(CTX, instance_uuid),
    )

    back = await reaches(db_pool, instance_uuid, "shelved_offloaded")
    assert back.fault is not None
    assert "valid host" in back.fault.message
    assert back.host is None
    assert await held(db_pool, instance_uuid) == []
    assert back.system_metadata[shelves.IMAGE_KEY] == str(image_id)
    async with db_pool.acquire() as conn:
        assert (await images.get(conn, image_id)).status == "active"
    result, count = (await actions(db_pool, instance_uuid))["unshelve"]
    assert (result, count) == ("Error", 1)


async def test_kept_shelved_then_offloaded_and_unshelved_in_place(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """With KEEL_SHELVED_OFFLOAD_TIME -1 the server stays SHELVED; an unshelve powers its
    guest on where it is; each result handled twice at once changes it once."""
    host = await register(conductor, "shelf-kept")
    agent = ShelvingCompute(conductor)
    agent.node = host.node_uuid
    await serve_stand_in(agent_transport, host, agent)
    instance_uuid = await active_server(db_pool, conductor, agent)
    token = (await get(db_pool, instance_uuid)).copy_token
    compute = ComputeAPI(agent_transport)
    keeping = Shelving(db_pool, compute, offload_time=-1, service_down_time=60)
    image_id = await shelve(db_pool, instance_uuid)

    shelved = InstanceActionResult(
        instance_uuid=instance_uuid, action=PowerAction.SHELVE, success=True
    )
    await asyncio.gather(keeping.record_result(CTX, shelved), keeping.record_result(CTX, shelved))

    kept = await get(db_pool, instance_uuid)
    assert (kept.vm_state, kept.task_state, kept.power_state) == ("shelved", None, 4)
    assert (kept.host, kept.copy_token) == ("shelf-kept", token)
    assert len(await held(db_pool, instance_uuid)) == 1

    async with db_pool.acquire() as conn:
        assert await instances.begin_task(
            conn, instance_uuid, TaskState.UNSHELVING, vm_states=(VmState.SHELVED,)
        )
    unshelved = InstanceActionResult(
        instance_uuid=instance_uuid, action=PowerAction.UNSHELVE, success=True
    )
    await asyncio.gather(
        keeping.record_result(CTX, unshelved), keeping.record_result(CTX, unshelved)
    )

    running = await get(db_pool, instance_uuid)
    assert (running.vm_state, running.task_state, running.power_state) == ("active", None, 1)
    assert (running.host, running.copy_token, running.system_metadata) == (
        "shelf-kept",
        token,
        {},
    )
    async with db_pool.acquire() as conn:
        assert await conn.fetchval("SELECT deleted_at FROM images WHERE id = $1", image_id)


async def test_an_offload_cut_off_is_completed_by_the_deadline_and_a_late_result_ignored(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    host = await register(conductor, "shelf-cut")
    agent = ShelvingCompute(conductor)
    agent.node = host.node_uuid
    await serve_stand_in(agent_transport, host, agent)
    instance_uuid = await active_server(db_pool, conductor, agent)
    await shelve(db_pool, instance_uuid)
    async with db_pool.acquire() as conn:
        # The conductor recorded the shelve and began the offload, then died.
        assert await shelves.shelved(conn, instance_uuid, offload=True) is not None
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            instance_uuid,
        )
    sweep = ShelveDeadline(
        db_pool,
        ComputeAPI(agent_transport),
        task_timeout=60,
        build_timeout=60,
        offload_time=0,
        down_time=60,
    )

    ended = await asyncio.gather(sweep.sweep(), sweep.sweep())

    assert sum(ended) == 1
    done = await get(db_pool, instance_uuid)
    assert (done.vm_state, done.task_state, done.host) == ("shelved_offloaded", None, None)
    assert await held(db_pool, instance_uuid) == []
    late = InstanceActionResult(
        instance_uuid=instance_uuid, action=PowerAction.SHELVE_OFFLOAD, success=True
    )
    await conductor.client.cast(CTX, "instance_action_result", late, version="1.18")
    await conductor.instance_action_result(CTX, instance_uuid, PowerAction.SHELVE, success=True)
    await asyncio.sleep(0.5)
    assert (await get(db_pool, instance_uuid)).vm_state == "shelved_offloaded"


async def test_an_unshelve_build_past_its_deadline_goes_back_and_its_late_guest_is_refused(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    host = await register(conductor, "shelf-late")
    agent = ShelvingCompute(conductor)
    agent.node = host.node_uuid
    await serve_stand_in(agent_transport, host, agent)
    instance_uuid = await active_server(db_pool, conductor, agent)
    image_id = await shelve(db_pool, instance_uuid)
    await conductor.instance_action_result(CTX, instance_uuid, PowerAction.SHELVE, success=True)
    await reaches(db_pool, instance_uuid, "shelved_offloaded")
    agent.report = False
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE images SET status = 'active' WHERE id = $1", image_id)
        token = uuid.uuid4()
        assert await shelves.begin_unshelve(conn, instance_uuid, token) is not None
    task = UnshelveTask(
        CTX,
        instance_uuid,
        pool=db_pool,
        scheduler=SchedulerAPI(agent_transport, timeout=20),
        compute=ComputeAPI(agent_transport),
        service_down_time=60,
    )
    await task.run()
    spawning = await get(db_pool, instance_uuid)
    assert (spawning.vm_state, spawning.task_state) == ("shelved_offloaded", "spawning")
    assert len(await held(db_pool, instance_uuid)) == 1
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            instance_uuid,
        )
    sweep = ShelveDeadline(
        db_pool,
        ComputeAPI(agent_transport),
        task_timeout=60,
        build_timeout=60,
        offload_time=0,
        down_time=60,
    )

    assert sum(await asyncio.gather(sweep.sweep(), sweep.sweep())) == 1

    back = await get(db_pool, instance_uuid)
    assert (back.vm_state, back.task_state, back.host) == ("shelved_offloaded", None, None)
    assert back.copy_token != token
    assert await held(db_pool, instance_uuid) == []
    # The guest the late build made is not the server's copy: its result changes nothing.
    await instance_events.record_build_result(
        db_pool,
        InstanceBuildResult(
            instance_uuid=instance_uuid, success=True, built=CopyToken(token=token)
        ),
    )
    assert (await get(db_pool, instance_uuid)).vm_state == "shelved_offloaded"
    check = await conductor.check_build(CTX, instance_uuid, host.node_uuid, None)
    assert check is not None
    assert check.verdict is not BuildVerdict.BUILD


async def test_a_positive_offload_time_offloads_a_server_shelved_longer_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    host = await register(conductor, "shelf-timed")
    agent = ShelvingCompute(conductor)
    agent.node = host.node_uuid
    await serve_stand_in(agent_transport, host, agent)
    instance_uuid = await active_server(db_pool, conductor, agent)
    compute = ComputeAPI(agent_transport)
    timed = Shelving(db_pool, compute, offload_time=3600, service_down_time=60)
    await shelve(db_pool, instance_uuid)
    result = InstanceActionResult(
        instance_uuid=instance_uuid, action=PowerAction.SHELVE, success=True
    )
    await timed.record_result(CTX, result)
    sweep = ShelveDeadline(
        db_pool, compute, task_timeout=600, build_timeout=600, offload_time=3600, down_time=60
    )

    assert await sweep.sweep() == 0  # shelved just now: kept
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances
                  SET system_metadata = system_metadata
                      || jsonb_build_object('shelved_at', (now() - interval '2 hours')::text)
                WHERE uuid = $1""",
            instance_uuid,
        )
    begun = await asyncio.gather(sweep.sweep(), sweep.sweep())

    assert sum(begun) == 1
    offloaded = await reaches(db_pool, instance_uuid, "shelved_offloaded")
    assert offloaded.host is None
    assert agent.offloaded == [instance_uuid]
    assert await held(db_pool, instance_uuid) == []
    assert (await actions(db_pool, instance_uuid))["shelveOffload"] == ("Success", 1)


class FlakyCompute(ComputeAPI):
    """The broker fails the first offload cast, as a dropped connection does."""

    failures = 1

    async def shelve_offload_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise MessagingTimeout("the connection closed before the broker confirmed it")
        await super().shelve_offload_instance(ctx, service_uuid, instance_uuid)


async def test_an_offload_the_broker_lost_is_asked_again_when_the_result_comes_back(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    host = await register(conductor, "shelf-flaky")
    agent = ShelvingCompute(conductor)
    agent.node = host.node_uuid
    await serve_stand_in(agent_transport, host, agent)
    instance_uuid = await active_server(db_pool, conductor, agent)
    shelving = Shelving(
        db_pool, FlakyCompute(agent_transport), offload_time=0, service_down_time=60
    )
    await shelve(db_pool, instance_uuid)
    result = InstanceActionResult(
        instance_uuid=instance_uuid, action=PowerAction.SHELVE, success=True
    )

    with pytest.raises(MessagingTimeout):
        await shelving.record_result(CTX, result)
    assert (await get(db_pool, instance_uuid)).task_state == "shelving_offloading"
    await shelving.record_result(CTX, result)  # the result, delivered again

    offloaded = await reaches(db_pool, instance_uuid, "shelved_offloaded")
    assert offloaded.host is None
    assert agent.offloaded == [instance_uuid]
