"""The API's OpenAPI document, served at ``/openapi.json`` to whom the settings allow.

``KEEL_API__OPENAPI`` decides: ``admin`` (the default) serves it to admin tokens,
``public`` to anyone, ``off`` to no one (404). The document describes every route's
parameters and request body, the ``X-Auth-Token`` header, and the one shape of every
error: a fault, ``{"<faultName>": {"code": N, "message": "..."}}``. That is enough for
a fuzzer such as schemathesis to exercise the API from the outside.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.utils import get_openapi

from services.api.auth import authenticate, require_admin
from services.api.faults import ItemNotFound
from shared.config import Settings

router = APIRouter()

PATH = "/openapi.json"

FAULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": 'A fault: {"<faultName>": {"code": N, "message": "..."}}',
    "minProperties": 1,
    "maxProperties": 1,
    "additionalProperties": {
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
    },
}
_FAULT_RESPONSE = {
    "description": "A fault",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Fault"}}},
}


def _describe_faults(document: dict[str, Any]) -> None:
    """Replace FastAPI's 422 validation answers (keel answers 400) with the fault shape."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses["4XX"] = _FAULT_RESPONSE
            responses["5XX"] = _FAULT_RESPONSE
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Fault"] = FAULT_SCHEMA


def _describe_auth(document: dict[str, Any]) -> None:
    components = document.setdefault("components", {})
    components["securitySchemes"] = {
        "token": {"type": "apiKey", "in": "header", "name": "X-Auth-Token"}
    }
    document["security"] = [{"token": []}]


def document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app``, built once and kept on the app."""
    if app.openapi_schema is None:
        built = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            description=app.description,
            routes=app.routes,
        )
        _describe_faults(built)
        _describe_auth(built)
        app.openapi_schema = built
    return app.openapi_schema


@router.get(PATH, include_in_schema=False)
async def openapi_document(request: Request) -> dict[str, Any]:
    settings: Settings = request.app.state.settings
    if settings.api.openapi == "off":
        raise ItemNotFound("The resource could not be found.")
    if settings.api.openapi == "admin":
        require_admin(authenticate(request))
    return document(request.app)
