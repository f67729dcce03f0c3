"""Fault bodies and the messages of request validation errors."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from services.api.http.faults import fault_body, fault_response, validation_message


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (400, "badRequest"),
        (403, "forbidden"),
        (404, "itemNotFound"),
        (406, "notAcceptable"),
        (409, "conflictingRequest"),
        (500, "computeFault"),
        (503, "serviceUnavailable"),
        (599, "computeFault"),
    ],
)
def test_fault_is_named_after_its_code(code: int, name: str) -> None:
    assert fault_body(code, "what went wrong") == {
        name: {"code": code, "message": "what went wrong"}
    }


def test_unauthorized_has_keystone_shape() -> None:
    body = fault_body(401, "no token")
    assert body == {"error": {"code": 401, "title": "Unauthorized", "message": "no token"}}


def test_fault_response_is_json_with_status() -> None:
    response = fault_response(409, "busy")
    assert response.status_code == 409
    assert response.media_type == "application/json"
    assert json.loads(bytes(response.body)) == {
        "conflictingRequest": {"code": 409, "message": "busy"}
    }


class _Inner(BaseModel):
    name: str
    count: int = 1


class _Outer(BaseModel):
    server: _Inner


def _errors(data: object) -> list[dict[str, object]]:
    with pytest.raises(ValidationError) as caught:
        _Outer.model_validate(data)
    return [{**e, "loc": ("body", *e["loc"])} for e in caught.value.errors()]


def test_wrong_type_names_the_field_and_value() -> None:
    message = validation_message(_errors({"server": {"name": 123}}))
    assert message.startswith("Invalid input for field/attribute server.name. Value: 123.")


def test_missing_field_is_named() -> None:
    message = validation_message(_errors({"server": {}}))
    assert message == "Invalid input for field/attribute server.name: it is required."


def test_malformed_json() -> None:
    error = {"type": "json_invalid", "loc": ("body", 3), "ctx": {"error": "Expecting value"}}
    assert validation_message([error]) == "Malformed request body: Expecting value."


def test_body_that_is_not_an_object() -> None:
    error = {"type": "model_attributes_type", "loc": ("body",), "input": [1]}
    assert validation_message([error]) == "The request body must be a JSON object."


def test_body_that_is_not_json() -> None:
    error = {"type": "model_attributes_type", "loc": ("body",), "input": b"a=b"}
    assert "Content-Type: application/json" in validation_message([error])


def test_missing_body() -> None:
    error = {"type": "missing", "loc": ("body",), "input": None}
    assert "missing" in validation_message([error])


def test_query_parameter_errors_say_so() -> None:
    error = {"type": "int_parsing", "loc": ("query", "limit"), "input": "x", "msg": "bad"}
    assert validation_message([error]) == "Invalid input for query parameter limit. Value: x. bad"


def test_long_values_are_shortened() -> None:
    message = validation_message(_errors({"server": {"name": ["x" * 500]}}))
    assert len(message) < 250


def test_messages_are_always_encodable() -> None:
    response = fault_response(400, "bad name '\ud800'")
    body = json.loads(bytes(response.body))
    assert body["badRequest"]["message"] == "bad name '\\ud800'"


def test_a_503_says_when_to_retry() -> None:
    assert int(fault_response(503, "later").headers["Retry-After"]) > 0
    assert "Retry-After" not in fault_response(500, "bug").headers
