"""The request context: who asked, and the id that ties their request's logs together."""

from __future__ import annotations

import uuid
from contextvars import ContextVar

from pydantic import BaseModel, ConfigDict, Field


def new_request_id() -> str:
    return f"req-{uuid.uuid4()}"


class RequestContext(BaseModel):
    """Travels with every RPC message so each service logs the same request id."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    request_id: str = Field(default_factory=new_request_id)
    user_id: str | None = None
    project_id: str | None = None
    roles: tuple[str, ...] = ()

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @classmethod
    def internal(cls) -> RequestContext:
        """A context for work a service starts on its own (heartbeats, start-up)."""
        return cls(roles=("admin",))


#: The request id of the work the current task is doing; read by the log formatter.
current_request_id: ContextVar[str | None] = ContextVar("keel_request_id", default=None)

#: The broker user that sent the RPC message being handled (RabbitMQ checked it), if any.
current_sender: ContextVar[str | None] = ContextVar("keel_sender", default=None)
