"""What travels on the wire: a JSON envelope for requests and one for replies.

Requests carry the method, the RPC version the sender speaks, the request context, the
method's arguments (validated against the handler's own pydantic model on arrival) and,
for calls, how many seconds the caller waits for the answer. That is a duration, not a
point in time: hosts' clocks differ, so the receiver counts it from the message's arrival
on its own monotonic clock. Nothing is pickled. Unknown fields are ignored: see the
compatibility rules in :mod:`shared.rpc`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.context import RequestContext

CONTENT_TYPE = "application/json"


class Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore")

    method: str = Field(pattern=r"^[a-z_][a-z0-9_]{0,100}$")
    version: str = Field(pattern=r"^\d{1,4}\.\d{1,4}$")
    context: RequestContext
    args: dict[str, Any] = Field(default_factory=dict)
    #: Seconds the caller waits for the reply, from when it sent the call; ``None`` for casts.
    timeout: float | None = Field(default=None, gt=0)


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    message: str


class Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    result: Any = None
    error: ErrorInfo | None = None
