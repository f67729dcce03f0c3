"""The calling side of an RPC API: typed requests out, typed replies or errors back.

Each service's ``rpcapi.py`` wraps one :class:`RPCClient` and is the only way other code
talks to that service. The client refuses to send a version above its version cap, so an
``rpcapi`` asks :meth:`RPCClient.can_send_version` and steps its payload down for older
receivers (``exclude`` leaves out the arguments an older receiver does not know). The cap
is fixed (a version string) or decided at each send by a :class:`CapSource` such as
:class:`shared.version_pins.RpcPin`, which follows the deployment's oldest service.

A call whose reply queue went away with the caller's broker connection fails at once
with :class:`~shared.exceptions.ReplyQueueLost`: the request may or may not have been
handled. A call marked ``idempotent`` (it reads, or its handler gives the same answer
however often it runs) is then sent again, within the same timeout.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from shared.context import RequestContext
from shared.exceptions import (
    InvalidMessage,
    ReplyQueueLost,
    UnsupportedVersion,
    rebuild_remote,
)
from shared.rpc.envelope import Envelope, Reply
from shared.rpc.transport import Transport
from shared.versions import parse_version

LOG = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

#: Decides the version cap at each send (e.g. from the deployment's minimum version).
CapSource = Callable[[], Awaitable[str]]
#: What to leave out of a request for an older receiver, as pydantic's ``exclude`` takes it.
Exclude = set[str] | dict[str, Any]


def within(version: str, cap: str) -> bool:
    """True if ``version`` is within ``cap`` (same major, minor no higher)."""
    major, minor = parse_version(version)
    cap_major, cap_minor = parse_version(cap)
    return major == cap_major and minor <= cap_minor


class RPCClient:
    def __init__(
        self,
        transport: Transport,
        topic: str,
        *,
        version_cap: str | CapSource,
        timeout: float = 60.0,
    ) -> None:
        if isinstance(version_cap, str):
            parse_version(version_cap)
        self.transport = transport
        self.topic = topic
        self.version_cap = version_cap
        self.timeout = timeout

    async def cap(self) -> str:
        """The highest version this client may send now."""
        if isinstance(self.version_cap, str):
            return self.version_cap
        return await self.version_cap()

    async def can_send_version(self, version: str) -> bool:
        """True if ``version`` is within this client's cap (same major, minor ≤ cap's)."""
        return within(version, await self.cap())

    def for_topic(self, topic: str) -> RPCClient:
        """The same client aimed at another topic (e.g. one compute agent's queue)."""
        return RPCClient(self.transport, topic, version_cap=self.version_cap, timeout=self.timeout)

    async def _envelope(
        self,
        ctx: RequestContext,
        method: str,
        req: BaseModel,
        *,
        version: str,
        timeout: float | None,
        exclude: Exclude | None,
    ) -> bytes:
        cap = await self.cap()
        if not within(version, cap):
            raise UnsupportedVersion(
                f"refusing to send {method} at version {version}: "
                f"the version cap for {self.topic} is {cap}"
            )
        envelope = Envelope(
            method=method,
            version=version,
            context=ctx,
            args=req.model_dump(mode="json", exclude=exclude),
            timeout=timeout,
        )
        return envelope.model_dump_json().encode()

    @overload
    async def call(
        self,
        ctx: RequestContext,
        method: str,
        req: BaseModel,
        *,
        version: str,
        returns: type[M],
        timeout: float | None = None,
        exclude: Exclude | None = None,
        idempotent: bool = False,
    ) -> M: ...

    @overload
    async def call(
        self,
        ctx: RequestContext,
        method: str,
        req: BaseModel,
        *,
        version: str,
        returns: None = None,
        timeout: float | None = None,
        exclude: Exclude | None = None,
        idempotent: bool = False,
    ) -> None: ...

    async def call(
        self,
        ctx: RequestContext,
        method: str,
        req: BaseModel,
        *,
        version: str,
        returns: type[M] | None = None,
        timeout: float | None = None,
        exclude: Exclude | None = None,
        idempotent: bool = False,
    ) -> M | None:
        """Send ``req`` and wait for the reply; remote errors are raised here, typed.

        ``idempotent``: sent again if its reply queue is lost (see the module docstring).
        """
        wait = self.timeout if timeout is None else timeout
        body = await self._envelope(
            ctx, method, req, version=version, timeout=wait, exclude=exclude
        )
        raw = await self._send(method, body, wait, idempotent)
        try:
            reply = Reply.model_validate_json(raw)
        except ValidationError as exc:
            raise InvalidMessage(f"malformed reply to {method} from {self.topic}: {exc}") from None
        if reply.error is not None:
            raise rebuild_remote(reply.error.type, reply.error.message)
        if returns is None:
            return None
        try:
            return returns.model_validate(reply.result)
        except ValidationError as exc:
            raise InvalidMessage(
                f"unexpected result of {method} from {self.topic}: {exc}"
            ) from None

    async def _send(self, method: str, body: bytes, wait: float, idempotent: bool) -> bytes:
        message_id = str(uuid.uuid4())
        deadline = time.monotonic() + wait
        while True:
            try:
                return await self.transport.call(
                    self.topic, body, message_id=message_id, timeout=wait
                )
            except ReplyQueueLost as lost:
                wait = deadline - time.monotonic()
                if not idempotent or wait <= 0:
                    raise
                LOG.info(
                    "%s to %s lost its reply queue (%s); it is safe to repeat: sending it again",
                    method,
                    self.topic,
                    lost.message,
                    extra={"rpc_method": method},
                )

    async def cast(
        self,
        ctx: RequestContext,
        method: str,
        req: BaseModel,
        *,
        version: str,
        exclude: Exclude | None = None,
    ) -> None:
        """Send ``req`` without waiting for it to be handled."""
        body = await self._envelope(
            ctx, method, req, version=version, timeout=None, exclude=exclude
        )
        await self.transport.cast(self.topic, body, message_id=str(uuid.uuid4()))
        LOG.debug("cast %s to %s", method, self.topic, extra={"rpc_method": method})
