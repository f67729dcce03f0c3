"""Error responses in the shapes the OpenStack client understands.

Every error the API returns is a JSON *fault*: ``{"badRequest": {"code": 400,
"message": "..."}}``, named after its status code as Nova names it. A missing or unknown
token is answered as Keystone's middleware does: ``{"error": {"code": 401, ...}}``.

Handlers registered by :func:`install` turn into faults: :class:`Fault` raised by a
route, request validation errors (always 400, never FastAPI's 422), unknown routes and
methods, and keel's own expected errors (``NotFound`` → 404, ``Conflict`` → 409,
``OverQuota`` and ``ImageProtected`` → 403, ``HostTaskRefused`` → 400, a messaging
failure → 503).

Under ``/identity`` every error has the identity API's shape, ``{"error": {"code",
"title", "message"}}``.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from shared.exceptions import (
    Conflict,
    HostTaskRefused,
    ImageProtected,
    KeelError,
    MessagingError,
    NotFound,
    OverQuota,
)

LOG = logging.getLogger(__name__)

FAULT_NAMES = {
    400: "badRequest",
    401: "unauthorized",
    403: "forbidden",
    404: "itemNotFound",
    405: "badMethod",
    406: "notAcceptable",
    409: "conflictingRequest",
    413: "overLimit",
    415: "badMediaType",
    429: "overLimit",
    501: "notImplemented",
    503: "serviceUnavailable",
}

UNAUTHORIZED_MESSAGE = "The request you have made requires authentication."
IDENTITY_PREFIX = "/identity"
#: Seconds a client is told to wait before retrying a 503.
RETRY_AFTER_SECONDS = 5


class Fault(Exception):
    """An error answer: raise it from a route to reply with a fault body."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BadRequest(Fault):
    def __init__(self, message: str) -> None:
        super().__init__(400, message)


class Unauthorized(Fault):
    def __init__(self, message: str = UNAUTHORIZED_MESSAGE) -> None:
        super().__init__(401, message)


class Forbidden(Fault):
    def __init__(self, message: str) -> None:
        super().__init__(403, message)


class ItemNotFound(Fault):
    def __init__(self, message: str) -> None:
        super().__init__(404, message)


class ConflictingRequest(Fault):
    def __init__(self, message: str) -> None:
        super().__init__(409, message)


class ServiceUnavailable(Fault):
    def __init__(self, message: str) -> None:
        super().__init__(503, message)


def encodable(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates) written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def fault_body(code: int, message: str) -> dict[str, Any]:
    message = encodable(message)
    if code == 401:
        return {"error": {"code": 401, "title": "Unauthorized", "message": message}}
    name = FAULT_NAMES.get(code, "computeFault")
    return {name: {"code": code, "message": message}}


def identity_error_body(code: int, message: str) -> dict[str, Any]:
    try:
        title = HTTPStatus(code).phrase
    except ValueError:
        title = "Error"
    return {"error": {"code": code, "title": title, "message": message}}


def fault_response(code: int, message: str) -> JSONResponse:
    """The fault; a 503 also says, in ``Retry-After``, when to try again."""
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if code == 503 else None
    return JSONResponse(fault_body(code, message), status_code=code, headers=headers)


def _respond(request: Request, code: int, message: str) -> JSONResponse:
    """A fault for the compute and image APIs; an identity-shaped error under /identity."""
    path = request.url.path
    if path == IDENTITY_PREFIX or path.startswith(IDENTITY_PREFIX + "/"):
        return JSONResponse(identity_error_body(code, message), status_code=code)
    return fault_response(code, message)


def short(value: Any, limit: int = 120) -> str:
    """A client's value, as it may be echoed in a message: bounded and encodable."""
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    text = encodable(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validation_message(errors: list[Any]) -> str:
    """One sentence naming the first problem in a request body or query string."""
    if not errors:
        return "Invalid request."
    error = errors[0]
    kind = error.get("type", "")
    loc = [str(part) for part in error.get("loc", ())]
    where = loc[0] if loc else "body"
    path = ".".join(loc[1:])
    if kind == "json_invalid":
        return f"Malformed request body: {error.get('ctx', {}).get('error', 'invalid JSON')}."
    if where == "body" and not path:
        if kind == "missing":
            return "The request body is missing; it must be a JSON object."
        if kind == "value_error":
            return f"Invalid request body: {str(error.get('msg')).removeprefix('Value error, ')}."
        if isinstance(error.get("input"), bytes | str):
            return "The request body must be JSON, sent with Content-Type: application/json."
        return "The request body must be a JSON object."
    if kind == "missing":
        return f"Invalid input for field/attribute {path}: it is required."
    label = "field/attribute" if where == "body" else "query parameter"
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"Invalid input for {label} {path}. Value: {short(error.get('input'))}. {message}"


async def _on_fault(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Fault)
    if exc.code >= 500:
        LOG.error("%s %s failed: %s", request.method, request.url.path, exc.message)
    return _respond(request, exc.code, exc.message)


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _respond(request, 400, validation_message(list(exc.errors())))


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = "The resource could not be found."
    elif exc.status_code == 405:
        message = f"The method {request.method} is not allowed for this resource."
    else:
        message = str(exc.detail)
    response = _respond(request, exc.status_code, message)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def keel_error_code(exc: KeelError) -> int:
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Conflict):
        return 409
    if isinstance(exc, OverQuota | ImageProtected):
        return 403
    if isinstance(exc, HostTaskRefused):
        return 400
    if isinstance(exc, MessagingError):
        return 503
    return 500


async def _on_keel_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KeelError)
    code = keel_error_code(exc)
    if code >= 500:
        LOG.error("%s %s failed: %s", request.method, request.url.path, exc.message)
    return _respond(request, code, exc.message)


def install(app: FastAPI) -> None:
    """Register the handlers that turn errors into fault responses."""
    app.add_exception_handler(Fault, _on_fault)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(KeelError, _on_keel_error)
