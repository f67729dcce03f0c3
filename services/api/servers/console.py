"""``os-getConsoleOutput``: the end of a server's console log, read by its host's agent.

As in Nova, the body is ``{"os-getConsoleOutput": {"length": N}}``: ``length`` is an
integer (or a string of one) from -1, or null; -1 and null mean everything the agent
keeps (the log's last 100 KiB). The answer is 200 ``{"output": "..."}`` with control
characters other than tab and newline removed.

The server must be where its console is: a server never placed on a host (still
scheduling, or failed before), or one whose guest is being deleted or moved, is a 409,
as is one whose host's agent is down or has no queue, or is too old to be asked (compute
RPC 1.4). A stopped server's console is still read: its log stays on its host. A guest
its agent does not know is a 404.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import asyncpg
from fastapi.responses import JSONResponse

from services.api.http.faults import (
    BadRequest,
    ConflictingRequest,
    ItemNotFound,
    ServiceUnavailable,
)
from services.api.servers.lookup import host_service
from services.api.servers.power import too_old
from services.compute.rpcapi import ComputeAPI
from shared.context import RequestContext
from shared.exceptions import (
    ConsoleNotAvailable,
    GuestNotFound,
    MessagingError,
    MessagingTimeout,
    ServiceTooOld,
    Unroutable,
)
from shared.objects.instance import Instance
from shared.objects.states import TaskState

LOG = logging.getLogger(__name__)

ACTION = "os-getConsoleOutput"
_METHOD = "get_console_output"
#: Tasks during which the guest on the server's host may be going or gone.
BUSY_TASKS = (
    TaskState.DELETING,
    TaskState.REBUILDING,
    TaskState.REBUILD_SPAWNING,
    TaskState.RESIZE_PREP,
    TaskState.RESIZE_MIGRATING,
)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f]")
_INTEGER = re.compile(r"^-?[0-9]+$")


def requested_length(value: Any) -> int | None:
    """The number of lines asked for; ``None`` for all of them. A bad body is a 400."""
    if not isinstance(value, dict):
        raise BadRequest(
            f"Invalid input for field/attribute {ACTION}. Value: {value!r}. "
            f"{value!r} is not of type 'object'"
        )
    extra = sorted(set(value) - {"length"})
    if extra:
        raise BadRequest(
            f"Invalid input for field/attribute {ACTION}. Additional properties are not "
            f"allowed ({', '.join(repr(key) for key in extra)} was unexpected)"
        )
    length = value.get("length")
    if length is None:
        return None
    if isinstance(length, str) and _INTEGER.match(length):
        length = int(length)
    if isinstance(length, bool) or not isinstance(length, int):
        raise BadRequest(
            f"Invalid input for field/attribute length. Value: {length!r}. "
            f"{length!r} is not of type 'integer', 'string', 'null'"
        )
    if length < -1:
        raise BadRequest(
            f"Invalid input for field/attribute length. Value: {length}. "
            f"{length} is less than the minimum of -1"
        )
    return None if length == -1 else length


async def console_output(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    *,
    ctx: RequestContext,
    instance: Instance,
    value: Any,
    down_time: float,
) -> JSONResponse:
    """Ask the server's agent for its console log; see the module docstring."""
    length = requested_length(value)
    if not instance.host:
        raise ConflictingRequest(f"Instance {instance.uuid} is not ready: it has no host yet.")
    if instance.task_state in BUSY_TASKS:
        raise ConflictingRequest(
            f"Cannot '{ACTION}' instance {instance.uuid} while it is in task_state "
            f"{instance.task_state}"
        )
    if not await compute.can_send(_METHOD):
        reason = await too_old(pool, compute, ACTION, _METHOD, down_time)
        raise ConflictingRequest(f"Cannot '{ACTION}' instance {instance.uuid}: {reason}.")
    service = await host_service(pool, instance, down_time)
    if service is None or not service.is_up:
        raise ConflictingRequest(
            f"Instance {instance.uuid} is not ready: the compute service of host "
            f"{instance.host} is down, so its console cannot be read."
        )
    try:
        output = await compute.get_console_output(
            ctx, service.uuid, instance.uuid, tail_length=length
        )
    except (GuestNotFound, ConsoleNotAvailable) as exc:
        raise ItemNotFound(
            f"Guest console not available for {instance.uuid}: {exc.message}"
        ) from None
    except ServiceTooOld as exc:
        raise ConflictingRequest(
            f"Cannot '{ACTION}' instance {instance.uuid}: {exc.message}."
        ) from None
    except Unroutable:
        raise ConflictingRequest(
            f"Instance {instance.uuid} is not ready: the compute service of host "
            f"{service.host} has no queue on the message bus; is its agent running?"
        ) from None
    except MessagingTimeout:
        raise ServiceUnavailable(
            f"The compute agent of host {service.host} did not answer in time; retry later."
        ) from None
    except MessagingError as exc:
        raise ServiceUnavailable(
            f"The console could not be read: the message bus could not be reached "
            f"({exc.message}). Retry once RabbitMQ is available."
        ) from None
    LOG.info(
        "read the console of server %s from host %s",
        instance.uuid,
        service.host,
        extra={"instance_uuid": str(instance.uuid)},
    )
    return JSONResponse({"output": _CONTROL.sub("", output)})
