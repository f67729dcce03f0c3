"""The serving side of an RPC API: dispatch envelopes to an endpoint's typed methods.

An endpoint is an object (a service's ``manager.py``) whose public ``async`` methods are
its RPC methods. Each takes ``(ctx: RequestContext, req: SomeModel)`` and returns a
pydantic model or ``None``: the signature is the contract, read once at start-up.

Dispatch rules:

* a body larger than :data:`MAX_MESSAGE_BYTES` (read no further), a body that is not a
  valid envelope, a version this server does not speak
  (:class:`UnsupportedVersion`: same major and a higher minor, or another major; checked
  before the method, as oslo.messaging does), an unknown method (:class:`NoSuchMethod`)
  or arguments that do not validate is logged, answered with the typed error if the
  sender waits for a reply, and dead-lettered; the server keeps serving;
* a call that waited longer than its caller's timeout is dropped: nobody waits for its
  answer any more. The timeout travels as a duration and counts from the message's
  arrival on this process's monotonic clock, never from another host's wall clock;
* a server may have a *guard*, which sees each request with the broker user that sent
  it (the AMQP ``user_id`` RabbitMQ checked) before its method runs, and refuses it by
  raising :class:`~shared.exceptions.CallerRefused`: answered and acknowledged like any
  other refusal. The sender is also :data:`~shared.context.current_sender` while the
  method runs;
* what the handler's outcome becomes is the settlement policy of
  :mod:`shared.rpc.settlement`.
"""

from __future__ import annotations

import inspect
import logging
import time
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from shared.context import RequestContext, current_request_id, current_sender
from shared.exceptions import (
    CallerRefused,
    InvalidMessage,
    KeelError,
    MessagingError,
    NoSuchMethod,
    TransientError,
    UnsupportedVersion,
)
from shared.metrics import Metrics
from shared.rpc.envelope import Envelope, ErrorInfo, Reply
from shared.rpc.settlement import Outcome, RetryPolicy, classify, describe
from shared.rpc.transport import Consumer, IncomingMessage, Settle, Settlement, Transport
from shared.versions import is_compatible, parse_version

LOG = logging.getLogger(__name__)

#: The largest RPC message a server reads. keel's messages are a few kilobytes (a build
#: with the most user data a server may have is under 100 KB); anything larger is not one
#: of them and is dead-lettered unread.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

Method = Callable[[RequestContext, BaseModel], Awaitable[BaseModel | None]]

#: ``guard(sender, method, request)``: raises to refuse ``request`` from broker user
#: ``sender`` (``None`` where the transport has no users).
Guard = Callable[[str | None, str, BaseModel], Awaitable[None]]


@dataclass(frozen=True)
class _Route:
    func: Method
    request: type[BaseModel]


def _routes(endpoint: object) -> dict[str, _Route]:
    """Read the endpoint's public async methods and their request models."""
    routes: dict[str, _Route] = {}
    for name, func in inspect.getmembers(endpoint, inspect.iscoroutinefunction):
        if name.startswith("_"):
            continue
        hints = typing.get_type_hints(func)
        params = list(inspect.signature(func).parameters)
        if len(params) != 2:
            raise TypeError(f"RPC method {name} must take (ctx, req), not {params}")
        request = hints.get(params[1])
        if not (isinstance(request, type) and issubclass(request, BaseModel)):
            raise TypeError(f"RPC method {name} must take a pydantic model as {params[1]}")
        routes[name] = _Route(func=func, request=request)
    return routes


def _error_reply(exc_type: str, message: str) -> bytes:
    return Reply(error=ErrorInfo(type=exc_type, message=message)).model_dump_json().encode()


class _Unservable(Exception):
    """A message this server can never handle, and the error its caller gets."""

    def __init__(self, error: MessagingError) -> None:
        super().__init__(error.message)
        self.error = error


class RPCServer:
    def __init__(
        self,
        transport: Transport,
        topic: str,
        endpoint: object,
        *,
        version: str,
        policy: RetryPolicy | None = None,
        metrics: Metrics | None = None,
        guard: Guard | None = None,
    ) -> None:
        parse_version(version)
        self.guard = guard
        self.transport = transport
        self.topic = topic
        self.version = version
        self.policy = policy or RetryPolicy()
        self.metrics = metrics or Metrics()
        self._routes = _routes(endpoint)
        self._consumer: Consumer | None = None

    @property
    def methods(self) -> frozenset[str]:
        return frozenset(self._routes)

    async def start(self, prefetch: int = 16) -> None:
        self._consumer = await self.transport.serve(self.topic, self.handle, prefetch=prefetch)
        LOG.info("serving %s at RPC version %s", self.topic, self.version)

    async def stop(self, drain_timeout: float = 30.0) -> None:
        if self._consumer is not None:
            await self._consumer.stop(drain_timeout)
            self._consumer = None

    def _parse(self, message: IncomingMessage) -> tuple[Envelope, _Route, BaseModel]:
        if len(message.body) > MAX_MESSAGE_BYTES:
            raise _Unservable(
                InvalidMessage(
                    f"message of {len(message.body)} bytes is larger than the "
                    f"{MAX_MESSAGE_BYTES} bytes an RPC message may have"
                )
            )
        try:
            envelope = Envelope.model_validate_json(message.body)
        except ValidationError as exc:
            raise _Unservable(InvalidMessage(f"malformed envelope: {exc}")) from None
        if not is_compatible(envelope.version, self.version):
            raise _Unservable(
                UnsupportedVersion(
                    f"{self.topic} speaks {self.version}; cannot serve "
                    f"{envelope.method} at {envelope.version}"
                )
            )
        route = self._routes.get(envelope.method)
        if route is None:
            raise _Unservable(NoSuchMethod(f"{self.topic} has no RPC method {envelope.method!r}"))
        try:
            request = route.request.model_validate(envelope.args)
        except ValidationError as exc:
            raise _Unservable(
                InvalidMessage(f"bad arguments for {envelope.method}: {exc}")
            ) from None
        return envelope, route, request

    async def handle(self, message: IncomingMessage) -> Settlement:
        try:
            envelope, route, request = self._parse(message)
        except _Unservable as unservable:
            error = unservable.error
            LOG.warning(
                "dead-lettering message %s on %s: %s", message.message_id, self.topic, error
            )
            reply = _error_reply(type(error).__name__, error.message) if message.is_call else None
            settlement = Settlement(Settle.DEAD_LETTER, reply, f"{type(error).__name__}: {error}")
            self._count("unparsable", settlement)
            return settlement
        token = current_request_id.set(envelope.context.request_id)
        sender = current_sender.set(message.user_id)
        try:
            settlement = await self._dispatch(message, envelope, route, request)
        finally:
            current_sender.reset(sender)
            current_request_id.reset(token)
        self._count(envelope.method, settlement)
        self.metrics.rpc_handle_seconds.labels(topic=self._family, method=envelope.method).observe(
            time.monotonic() - message.received_at
        )
        return settlement

    def _count(self, method: str, settlement: Settlement) -> None:
        self.metrics.messages.labels(
            topic=self._family, method=method, settled=settlement.settle.value
        ).inc()
        if settlement.settle is Settle.DEAD_LETTER:
            failure = settlement.reason.partition(":")[0] or "unknown"
            self.metrics.dead_lettered.labels(topic=self._family, failure=failure[:60]).inc()

    @property
    def _family(self) -> str:
        """The topic without an agent's uuid, so metrics do not grow a label per agent."""
        return self.topic.partition(".")[0]

    async def _dispatch(
        self, message: IncomingMessage, envelope: Envelope, route: _Route, request: BaseModel
    ) -> Settlement:
        extra: dict[str, Any] = {
            "rpc_method": envelope.method,
            "rpc_version": envelope.version,
            **_instance_of(request),
        }
        if envelope.timeout is not None:
            waited = time.monotonic() - message.received_at
            if waited > envelope.timeout:
                LOG.warning(
                    "dropping %s: its caller stopped waiting %.1fs ago",
                    envelope.method,
                    waited - envelope.timeout,
                    extra=extra,
                )
                return Settlement(Settle.ACK)
        if message.delivery_count:
            LOG.info(
                "%s delivered again (delivery %d of at most %d)",
                envelope.method,
                message.delivery_count + 1,
                self.policy.delivery_limit + 1,
                extra=extra,
            )
        what = f"{envelope.method} on {self.topic}"

        async def invoke() -> BaseModel | None:
            if self.guard is not None:
                await self.guard(message.user_id, envelope.method, request)
            return await route.func(envelope.context, request)

        try:
            result = await self.policy.run(what, invoke, extra)
        except Exception as exc:
            return self._settle_failure(message, envelope, exc, extra)
        if not message.is_call:
            return Settlement(Settle.ACK)
        data = None if result is None else result.model_dump(mode="json")
        return Settlement(Settle.ACK, Reply(result=data).model_dump_json().encode())

    def _settle_failure(
        self,
        message: IncomingMessage,
        envelope: Envelope,
        exc: Exception,
        extra: dict[str, Any],
    ) -> Settlement:
        outcome = classify(exc)
        reason = describe(exc)
        if outcome is Outcome.DONE:
            assert isinstance(exc, KeelError)
            if not isinstance(exc, CallerRefused):  # the guard logged it, with its sender
                LOG.warning("%s failed: %s", envelope.method, exc.message, extra=extra)
            reply = _error_reply(type(exc).__name__, exc.message) if message.is_call else None
            return Settlement(Settle.ACK, reply)
        if outcome is Outcome.POISON:
            LOG.exception(
                "%s failed unexpectedly; dead-lettering message %s",
                envelope.method,
                message.message_id,
                extra=extra,
            )
            reply = _error_reply(type(exc).__name__, str(exc)) if message.is_call else None
            return Settlement(Settle.DEAD_LETTER, reply, reason)
        if message.is_call:
            LOG.warning(
                "%s kept failing for %gs: %s; answering the caller with a transient error",
                envelope.method,
                self.policy.handler_retry_timeout,
                reason,
                extra=extra,
            )
            transient = TransientError(f"{envelope.method} failed temporarily: {reason}")
            return Settlement(Settle.ACK, _error_reply("TransientError", transient.message))
        if message.delivery_count >= self.policy.delivery_limit:
            LOG.error(
                "%s kept failing over %d deliveries: %s; dead-lettering message %s",
                envelope.method,
                message.delivery_count + 1,
                reason,
                message.message_id,
                extra=extra,
            )
            deliveries = message.delivery_count + 1
            return Settlement(Settle.DEAD_LETTER, None, f"after {deliveries} deliveries: {reason}")
        LOG.warning(
            "%s failed temporarily: %s; returning it to the queue (delivery %d of at most %d)",
            envelope.method,
            reason,
            message.delivery_count + 1,
            self.policy.delivery_limit + 1,
            extra=extra,
        )
        return Settlement(Settle.REQUEUE, None, reason)


def _instance_of(request: BaseModel) -> dict[str, str]:
    """The instance a request is about, for log lines, if it names one."""
    value = getattr(request, "instance_uuid", None)
    for holder, name in (("instance", "uuid"), ("spec", "instance_uuid")):
        if value is None:
            value = getattr(getattr(request, holder, None), name, None)
    return {} if value is None else {"instance_uuid": str(value)}
