"""keel-compute: the agent on each compute host (console script ``keel-compute``).

The composition root: it builds the RabbitMQ transport and the virt driver from the
settings, then hands them to :func:`services.compute.agent.start_agent`, which does the
start-up in order. It runs until SIGTERM/SIGINT, then drains and exits 0. A refusal to
start (a corrupt identity file, a renamed host, a lost or replaced identity, a conductor
too old or not answering) exits 1 with one line that says why and what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from services.compute.agent import Agent, start_agent
from services.compute.virt import load_driver
from shared.config import Settings
from shared.rpc.amqp import AmqpTransport
from shared.runtime import Lifecycle, run

LOG = logging.getLogger(__name__)


async def _start_unless_stopped(settings: Settings, lifecycle: Lifecycle) -> Agent | None:
    """Start the agent; ``None`` if asked to stop before start-up finished."""
    transport = AmqpTransport.from_settings(settings)
    starting = asyncio.create_task(
        start_agent(
            settings,
            transport,
            load_driver(settings),
            service_version=settings.service_version,
            on_refused=lifecycle.fail,
            metrics=lifecycle.metrics,
        )
    )
    stopping = asyncio.create_task(lifecycle.stopping.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    if starting.done():
        return starting.result()
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    LOG.info("stopped before start-up finished")
    return None


def warn_ignored_settings(settings: Settings) -> None:
    """Say so, once at start-up, for each setting this agent accepts but ignores."""
    if settings.workarounds.destroy_after_evacuate is not None:
        LOG.warning(
            "KEEL_WORKAROUNDS__DESTROY_AFTER_EVACUATE is deprecated and ignored: guests are "
            "destroyed only when a migration record says they were rebuilt elsewhere"
        )


async def serve(settings: Settings, lifecycle: Lifecycle) -> None:
    """Run keel-compute until ``lifecycle.stopping`` is set."""
    warn_ignored_settings(settings)
    agent = await _start_unless_stopped(settings, lifecycle)
    if agent is None:
        return
    try:
        await lifecycle.stopping.wait()
    finally:
        await agent.stop()


def main(argv: Sequence[str] | None = None) -> None:
    run(
        "keel-compute",
        serve,
        argv,
        description="The keel agent on a compute host: builds and destroys its guests.",
    )
