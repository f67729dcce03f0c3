"""The API's OpenAPI document, served at ``/openapi.json`` to whom the settings allow.

``KEEL_API__OPENAPI`` decides: ``admin`` (the default) serves it to admin tokens,
``public`` to anyone, ``off`` to no one (404). The document describes every route's
parameters and request body, the ``X-Auth-Token`` header, each route's answers (status
codes per microversion and body schemas, :mod:`services.api.http.response_schemas`) and
the one shape of every error: a fault, ``{"<faultName>": {"code": N, "message": "..."}}``
(Neutron's error under ``/network``). A fuzzer such as schemathesis can hold the API to
it from the outside: statuses, shapes and no server errors.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.utils import get_openapi

from services.api.http.auth import authenticate, require_admin
from services.api.http.faults import ItemNotFound
from services.api.http.response_schemas import REQUEST_BODIES, RESPONSES
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


NEUTRON_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": 'A Networking API error: {"NeutronError": {"type", "message", "detail"}}',
    "required": ["NeutronError"],
    "properties": {
        "NeutronError": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}
_NEUTRON_ERROR_RESPONSE = {
    "description": "A Networking API error (a fault when the token is refused)",
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [
                    {"$ref": "#/components/schemas/NeutronError"},
                    {"$ref": "#/components/schemas/Fault"},
                ]
            }
        }
    },
}


def _describe_faults(document: dict[str, Any]) -> None:
    """Replace FastAPI's 422 validation answers (keel answers 400) with the fault shape
    (Neutron's error shape under ``/network``)."""
    for path, operations in document.get("paths", {}).items():
        error = _NEUTRON_ERROR_RESPONSE if path.startswith("/network") else _FAULT_RESPONSE
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses["4XX"] = error
            responses["5XX"] = _FAULT_RESPONSE
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Fault"] = FAULT_SCHEMA
    schemas["NeutronError"] = NEUTRON_ERROR_SCHEMA


def _describe_responses(document: dict[str, Any]) -> None:
    """Each route's real answers (:mod:`services.api.http.response_schemas`): statuses per
    microversion and body schemas; and the request bodies handlers read themselves."""
    paths = document.get("paths", {})
    for (path, method), answers in RESPONSES.items():
        operation = paths.get(path, {}).get(method)
        if operation is None:
            continue
        responses = operation.setdefault("responses", {})
        for status in [s for s in responses if s.startswith("2")]:
            del responses[status]
        for status, (description, schema) in answers.items():
            described: dict[str, Any] = {"description": description}
            if schema is not None:
                described["content"] = {"application/json": {"schema": schema}}
            responses[status] = described
    for (path, method), body in REQUEST_BODIES.items():
        operation = paths.get(path, {}).get(method)
        if operation is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": body}},
            }


#: What a create returns that names the new resource in later requests:
#: (create path, its status, where the id is in the body, the path parameter, users).
_LINKS = (
    ("/v2.1/servers", "202", "/server/id", "server_id", "/v2.1/servers/{server_id}"),
    ("/v2.1/flavors", "200", "/flavor/id", "flavor_id", "/v2.1/flavors/{flavor_id}"),
    ("/image/v2/images", "201", "/id", "image_id", "/image/v2/images/{image_id}"),
)


def _pointer(path: str, method: str) -> str:
    escaped = path.replace("~", "~0").replace("/", "~1")
    return f"#/paths/{escaped}/{method}"


def _describe_links(document: dict[str, Any]) -> None:
    """Say which created id the show and delete routes take, so a fuzzer can chain them."""
    paths = document.get("paths", {})
    for create, status, field, parameter, item in _LINKS:
        response = paths.get(create, {}).get("post", {}).get("responses", {}).get(status)
        if response is None:
            continue
        response["links"] = {
            f"{method.capitalize()}{parameter.title().replace('_', '')}": {
                "operationRef": _pointer(item, method),
                "parameters": {parameter: f"$response.body#{field}"},
            }
            for method in ("get", "delete")
            if method in paths.get(item, {})
        }


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
        _describe_responses(built)
        _describe_links(built)
        _describe_auth(built)
        app.openapi_schema = built
    return app.openapi_schema


@router.get(PATH, include_in_schema=False)
async def openapi_document(request: Request) -> dict[str, Any]:
    settings: Settings = request.app.state.settings
    if settings.api.openapi == "off":
        raise ItemNotFound("The resource could not be found.")
    if settings.api.openapi == "admin":
        await require_admin(await authenticate(request))
    return document(request.app)
