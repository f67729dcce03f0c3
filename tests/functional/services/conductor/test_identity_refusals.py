"""The real agent start-up code against the real conductor and PostgreSQL: a machine that
comes up under a new host name, without its identity file but with another node's guests
in its state directory, is refused, and the database is left exactly as it was."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import asyncpg
import pytest

from services.compute.agent import Agent, start_agent
from services.compute.virt.local import LocalDriver
from services.conductor.rpcapi import ConductorAPI
from shared.config import ComputeSettings, RpcSettings, Settings
from shared.context import RequestContext
from shared.db import instances
from shared.exceptions import HypervisorInUse
from shared.objects.states import VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor import stand_in
from tests.functional.services.conductor.stand_in import create_instance, eventually

pytestmark = pytest.mark.functional

TABLES = ("services", "compute_nodes", "instances", "allocations", "migrations")


async def dump(pool: asyncpg.Pool) -> dict[str, list[str]]:
    """Every row of the tables these checks must never touch, as JSON text."""
    return await stand_in.dump(pool, TABLES)


async def settled_dump(pool: asyncpg.Pool) -> dict[str, list[str]]:
    """:func:`dump`, once a stopped agent's last heartbeat (a message the conductor may
    still be handling) has changed its rows: two dumps a while apart agree."""
    last = await dump(pool)
    for _ in range(50):
        await asyncio.sleep(0.3)
        now = await dump(pool)
        if now == last:
            return now
        last = now
    raise AssertionError("the database kept changing after the agent stopped")


def agent_settings(settings: Settings, host: str, state_dir: Path) -> Settings:
    return Settings(
        host=host,
        state_dir=state_dir,
        transport_url=settings.transport_url,
        exchange=settings.exchange,
        report_interval=0.2,
        rpc=RpcSettings(call_timeout=10, connect_timeout=10, queue_expires=60),
        compute=ComputeSettings(drain_timeout=5, vcpus=4, memory_mb=4096, local_gb=40),
    )


async def run_agent(settings: Settings) -> Agent:
    transport = AmqpTransport(
        settings.transport_url,
        settings.exchange,
        queue_expires=settings.rpc.queue_expires,
        connect_timeout=settings.rpc.connect_timeout,
    )
    driver = LocalDriver(settings.state_dir, settings.host, vcpus=4, memory_mb=4096, local_gb=40)
    return await start_agent(settings, transport, driver)


async def active_server(pool: asyncpg.Pool, conductor: ConductorAPI) -> uuid.UUID:
    """A server built by the running agent, as keel-api and the conductor make it."""
    server = await create_instance(pool)
    await conductor.build_instances(RequestContext(user_id="u", project_id="p"), server)

    async def built() -> bool | None:
        async with pool.acquire() as conn:
            state = (await instances.get(conn, server)).vm_state
        return True if state == VmState.ACTIVE else None

    await eventually(built)
    return server


async def test_a_renamed_machine_holding_another_nodes_guests_is_refused(
    settings: Settings, conductor: ConductorAPI, db_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    old_dir = tmp_path / "old"
    agent = await run_agent(agent_settings(settings, "old-name", old_dir))
    try:
        server = await active_server(db_pool, conductor)
    finally:
        await agent.stop()
    assert (old_dir / "instances" / str(server)).is_dir()
    # The same machine under a new name, its identity file lost: its guests are still there.
    new_dir = tmp_path / "new"
    shutil.copytree(old_dir, new_dir)
    (new_dir / "compute_id").unlink()
    before = await settled_dump(db_pool)

    with pytest.raises(HypervisorInUse) as refused:
        await run_agent(agent_settings(settings, "new-name", new_dir))

    message = refused.value.message
    assert message.startswith(
        "a new service whose hypervisor already holds instances: host 'new-name' is new to "
        f"the database, but {new_dir / 'instances'} holds 1 guest(s): {server}."
    )
    assert "Nothing was changed" in message
    assert await dump(db_pool) == before
    assert not (new_dir / "compute_id").exists()
    assert (new_dir / "instances" / str(server)).is_dir()

    # The way out the message gives: the old identity and host name back.
    shutil.copy(old_dir / "compute_id", new_dir / "compute_id")
    agent = await run_agent(agent_settings(settings, "old-name", new_dir))
    try:
        assert str(agent.registration.node_uuid) == (old_dir / "compute_id").read_text().strip()
    finally:
        await agent.stop()


async def test_a_new_host_with_an_empty_state_directory_starts(
    settings: Settings, conductor: ConductorAPI, db_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    (tmp_path / "instances" / ".building-leftover").mkdir(parents=True)

    agent = await run_agent(agent_settings(settings, "fresh", tmp_path))
    try:
        assert (tmp_path / "compute_id").read_text().strip() == str(agent.registration.node_uuid)
    finally:
        await agent.stop()
