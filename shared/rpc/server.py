"""The serving side of an RPC API: dispatch envelopes to an endpoint's typed methods.

An endpoint is an object (a service's ``manager.py``) whose public ``async`` methods are
its RPC methods. Each takes ``(ctx: RequestContext, req: SomeModel)`` and returns a
pydantic model or ``None``: the signature is the contract, read once at start-up.

Dispatch rules:

* a body that is not a valid envelope, arguments that do not validate, an unknown method
  (:class:`NoSuchMethod`) or a version this server does not speak
  (:class:`UnsupportedVersion`: same major and a higher minor, or another major) is
  logged, answered with the typed error if the sender waits for a reply, and
  dead-lettered; the server keeps serving;
* a business error (:class:`~shared.exceptions.KeelError`) raised by the handler is
  logged without a traceback and sent back by name;
* anything else is logged with its traceback and sent back as a generic error;
* a call whose deadline has passed is dropped: nobody waits for its answer.
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

from shared.context import RequestContext, current_request_id
from shared.exceptions import (
    InvalidMessage,
    KeelError,
    MessagingError,
    NoSuchMethod,
    UnsupportedVersion,
)
from shared.rpc.envelope import Envelope, ErrorInfo, Reply
from shared.rpc.transport import Consumer, IncomingMessage, RejectMessage, Transport
from shared.versions import is_compatible, parse_version

LOG = logging.getLogger(__name__)

Method = Callable[[RequestContext, BaseModel], Awaitable[BaseModel | None]]


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
            raise TypeError(f"RPC method {name}: {params[1]} must be a pydantic model")
        routes[name] = _Route(func=func, request=request)
    return routes


def _error_reply(exc: KeelError) -> bytes:
    reply = Reply(error=ErrorInfo(type=type(exc).__name__, message=exc.message))
    return reply.model_dump_json().encode()


class RPCServer:
    def __init__(self, transport: Transport, topic: str, endpoint: object, *, version: str) -> None:
        parse_version(version)
        self.transport = transport
        self.topic = topic
        self.version = version
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

    def _reject(self, message: IncomingMessage, error: MessagingError) -> RejectMessage:
        LOG.warning("dead-lettering message %s on %s: %s", message.message_id, self.topic, error)
        reply = _error_reply(error) if message.reply_to else None
        return RejectMessage(error.message, reply)

    def _parse(self, message: IncomingMessage) -> tuple[Envelope, _Route, BaseModel]:
        try:
            envelope = Envelope.model_validate_json(message.body)
        except ValidationError as exc:
            raise self._reject(message, InvalidMessage(f"malformed envelope: {exc}")) from None
        route = self._routes.get(envelope.method)
        if route is None:
            error: MessagingError = NoSuchMethod(
                f"{self.topic} has no RPC method {envelope.method!r}"
            )
            raise self._reject(message, error)
        if not is_compatible(envelope.version, self.version):
            error = UnsupportedVersion(
                f"{self.topic} speaks {self.version}; cannot serve "
                f"{envelope.method} at {envelope.version}"
            )
            raise self._reject(message, error)
        try:
            request = route.request.model_validate(envelope.args)
        except ValidationError as exc:
            error = InvalidMessage(f"bad arguments for {envelope.method}: {exc}")
            raise self._reject(message, error) from None
        return envelope, route, request

    async def handle(self, message: IncomingMessage) -> bytes | None:
        envelope, route, request = self._parse(message)
        token = current_request_id.set(envelope.context.request_id)
        extra: dict[str, Any] = {"rpc_method": envelope.method, "rpc_version": envelope.version}
        try:
            if envelope.deadline is not None and envelope.deadline < time.time():
                LOG.warning("dropping %s: its deadline has passed", envelope.method, extra=extra)
                return None
            try:
                result = await route.func(envelope.context, request)
                data = None if result is None else result.model_dump(mode="json")
                return Reply(result=data).model_dump_json().encode()
            except KeelError as exc:
                LOG.warning("%s failed: %s", envelope.method, exc.message, extra=extra)
                return _error_reply(exc)
            except Exception as exc:
                LOG.exception("%s failed unexpectedly", envelope.method, extra=extra)
                reply = Reply(error=ErrorInfo(type=type(exc).__name__, message=str(exc)))
                return reply.model_dump_json().encode()
        finally:
            current_request_id.reset(token)
