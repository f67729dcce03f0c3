"""Per-agent RabbitMQ users: their names and the permissions they get.

Each compute agent may connect as its own broker user, made by ``keel-manage agent
credentials HOST``. The user is named after the agent's *service UUID*
(``keel-compute-<uuid>``), which survives an operator rename of the host, so the
credentials do too; and since RabbitMQ checks every message's AMQP ``user_id`` against the
connection's user, a receiver knows for certain which agent sent a message
(:func:`service_of`). What it may then ask is checked by the receiver: the conductor
answers an agent only about its own service, nodes, instances and migrations
(:mod:`services.conductor.agent_authorisation`); the scheduler and other agents take nothing from
an agent at all.

The broker itself limits an agent user to (:func:`permissions`):

* reading only its own queue ``E.compute.<uuid>`` and its reply queues ``E.reply.*``
  (exclusive to the connection that declared them, so no other user can read one);
* binding its queue to the exchange only with its own routing keys, and publishing to
  the exchange only with the conductor's (RabbitMQ topic permissions);
* declaring nothing shared: the exchanges and dead-letter queues are declared by the
  control plane (an agent only checks that they exist);
* publishing replies through the default exchange, and dead letters from its own queue.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from uuid import UUID

from pydantic import BaseModel

from shared.exceptions import CallerRefused

LOG = logging.getLogger(__name__)

#: Every per-agent user's name starts so; the rest is the agent's service UUID.
USER_PREFIX = "keel-compute-"

_USER = re.compile(
    re.escape(USER_PREFIX) + r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
)


def user_for(service_uuid: UUID) -> str:
    """The broker user of the agent whose service is ``service_uuid``."""
    return f"{USER_PREFIX}{service_uuid}"


def service_of(user: str | None) -> UUID | None:
    """The service UUID of a per-agent user; ``None`` for any other user (or none)."""
    if user is None:
        return None
    match = _USER.fullmatch(user)
    return UUID(match.group(1)) if match else None


def refuse(sender: str, method: str, why: str) -> CallerRefused:
    """Log the refusal of ``method`` from ``sender`` and return the error to raise."""
    LOG.warning(
        "refused %s from broker user %s: %s",
        method,
        sender,
        why,
        extra={"decision": "rpc_refused", "sender": sender, "rpc_method": method},
    )
    return CallerRefused(f"{method} refused for broker user {sender}: {why}")


async def refuse_agents(sender: str | None, method: str, request: BaseModel) -> None:
    """An RPC server guard for topics only the control plane may send to.

    An agent has no business with the scheduler or with another agent: its broker user may
    publish to their queues through the default exchange (it needs that to answer calls),
    so the receiver refuses what such a user sends.
    """
    if service_of(sender) is not None:
        assert sender is not None
        raise refuse(sender, method, "compute agents may not send requests to this service")


@dataclass(frozen=True)
class TopicPermission:
    """What routing keys a user may publish (``write``) and bind (``read``) on one exchange."""

    exchange: str
    write: str
    read: str


@dataclass(frozen=True)
class Permissions:
    """A user's permissions in one virtual host: regular expressions on resource names."""

    configure: str
    write: str
    read: str
    topics: tuple[TopicPermission, ...]


def _any_of(*patterns: str) -> str:
    return "^(" + "|".join(patterns) + ")$"


def permissions(exchange: str, service_uuid: UUID) -> Permissions:
    """The permissions of the agent of ``service_uuid`` on keel's exchange ``exchange``."""
    own_queue = re.escape(f"{exchange}.compute.{service_uuid}")
    replies = re.escape(f"{exchange}.reply.") + r"[0-9a-f-]{36}"
    own_keys = _any_of(*(re.escape(f"{kind}.compute.{service_uuid}") for kind in ("cast", "call")))
    return Permissions(
        # Declare (and delete) only its own queue and its reply queues.
        configure=_any_of(own_queue, replies),
        # Publish to the exchange, to the dead-letter exchange and to callers' reply
        # queues (through the default exchange); bind its own queue.
        write=_any_of(
            re.escape(exchange), re.escape(f"{exchange}.dead"), "amq\\.default", own_queue
        ),
        # Bind to the exchange; consume its own queue and its replies.
        read=_any_of(re.escape(exchange), own_queue, replies),
        topics=(
            TopicPermission(exchange, write=_any_of(r"(cast|call)\.conductor"), read=own_keys),
            TopicPermission(f"{exchange}.dead", write=own_keys, read="^$"),
        ),
    )
