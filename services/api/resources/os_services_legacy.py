"""os-services changes before microversion 2.53: ``PUT /os-services/{action}``.

Clients at 2.1 to 2.52 name the service by ``host`` and ``binary`` in the body and the
change by the action in the path: ``enable``, ``disable``, ``disable-log-reason`` (with
``disabled_reason``) and, from 2.11, ``force-down`` (with ``forced_down``). The answer
echoes what was set, as Nova's does. Only compute services can be changed.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import asyncpg
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.microversion import APIVersion
from services.api.servers.moves import refuse_up_with_unconfirmed_evacuations
from shared.context import RequestContext
from shared.db import services
from shared.objects.service import Binary, canonical_binary

LOG = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

ACTIONS = ("enable", "disable", "disable-log-reason")
FORCE_DOWN = "force-down"


class LegacyServiceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, max_length=255, pattern=r"^[a-zA-Z0-9-._]*$")
    binary: str = Field(min_length=1, max_length=255)
    disabled_reason: str | None = Field(default=None, min_length=1, max_length=255)

    @field_validator("binary")
    @classmethod
    def _keel_name(cls, value: str) -> str:
        return canonical_binary(value)


class ForcedDownBody(LegacyServiceBody):
    forced_down: bool | None = None


def parse_body(model: type[M], body: Any) -> M:
    """``body`` as ``model``, or the 400 a request body that does not fit gets."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None


def actions_at(version: APIVersion) -> tuple[str, ...]:
    return (*ACTIONS, FORCE_DOWN) if version.at_least("2.11") else ACTIONS


def _changes(action: str, body: Any) -> tuple[LegacyServiceBody, dict[str, Any]]:
    """The parsed body and the fields ``action`` changes (as keyword arguments)."""
    if action == FORCE_DOWN:
        forced = parse_body(ForcedDownBody, body)
        if forced.forced_down is None:
            raise BadRequest("Missing forced_down field")
        return forced, {"forced_down": forced.forced_down}
    parsed = parse_body(LegacyServiceBody, body)
    if action == "enable":
        return parsed, {"disabled": False}
    if action == "disable":
        return parsed, {"disabled": True}
    if parsed.disabled_reason is None:
        raise BadRequest("Missing disabled reason field")
    return parsed, {"disabled": True, "disabled_reason": parsed.disabled_reason}


def _answer(action: str, parsed: LegacyServiceBody, changes: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = {"host": parsed.host, "binary": parsed.binary}
    if action == FORCE_DOWN:
        service["forced_down"] = changes["forced_down"]
        return {"service": service}
    service["status"] = "disabled" if changes["disabled"] else "enabled"
    if "disabled_reason" in changes:
        service["disabled_reason"] = changes["disabled_reason"]
    return {"service": service}


async def legacy_update(
    action: str,
    body: Any,
    *,
    pool: asyncpg.Pool,
    ctx: RequestContext,
    version: APIVersion,
    down_time: float,
) -> dict[str, Any]:
    """Apply ``action`` to the service ``body`` names; see the module docstring."""
    if action not in actions_at(version):
        raise ItemNotFound("Unknown action")
    parsed, changes = _changes(action, body)
    if parsed.binary != Binary.COMPUTE:
        raise BadRequest(
            f"Updating a {parsed.binary} service is not supported. "
            f"Only {Binary.COMPUTE} services can be updated."
        )
    async with pool.acquire() as conn:
        found = await services.list_services(
            conn, down_time, host=parsed.host, binary=parsed.binary
        )
        if not found:
            raise ItemNotFound(f"Could not find binary {parsed.binary} on host {parsed.host}.")
        for service in found:
            if changes.get("forced_down") is False:
                await refuse_up_with_unconfirmed_evacuations(conn, service)
            await services.update_status(conn, service.uuid, down_time, **changes)
    LOG.info(
        "service %s on %s updated by %s: %s %s",
        parsed.binary,
        parsed.host,
        ctx.user_id,
        action,
        changes,
    )
    return _answer(action, parsed, changes)
