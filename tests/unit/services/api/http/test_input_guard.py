"""The input guard's checks, and the guard in front of an application."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from services.api.http.input_guard import (
    MAX_DEPTH,
    HostileInput,
    InputGuard,
    check_document,
    check_url,
    parse_body,
    text_problem,
)


def test_text_postgresql_can_store_passes() -> None:
    for text in ("", "web-1", "ümlaut ✓ 中文 🚀", "tab\tnewline\n"):
        assert text_problem(text) is None


def test_nul_and_lone_surrogates_are_named() -> None:
    assert "NUL" in (text_problem("a\x00b") or "")
    problem = text_problem("a\ud800b") or ""
    assert "surrogate" in problem
    assert "\\ud800" in problem
    problem.encode("utf-8")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"a": [1, 2.5, "x", null, true]}', {"a": [1, 2.5, "x", None, True]}),
        (b"9223372036854775807", 9223372036854775807),
        (b"-9223372036854775808", -9223372036854775808),
        (b"1e-400", 0.0),
    ],
)
def test_json_within_range_parses(body: bytes, expected: Any) -> None:
    assert parse_body(body) == (True, expected)


@pytest.mark.parametrize(
    "body",
    [
        b"9223372036854775808",
        b"-9223372036854775809",
        b"1" + b"0" * 5000,
        b"NaN",
        b"[Infinity]",
        b'{"x": -Infinity}',
        b"1e400",
        b"[" * 100_000,
    ],
)
def test_numbers_out_of_range_and_deep_nesting_are_hostile(body: bytes) -> None:
    with pytest.raises(HostileInput):
        parse_body(body)


@pytest.mark.parametrize("body", [b"not json", b"{", b"\xff\xfe\x00garbage", b""])
def test_what_is_not_json_is_left_to_the_route(body: bytes) -> None:
    assert parse_body(body) == (False, None)


def test_documents_are_searched_at_every_depth_keys_included() -> None:
    check_document({"server": {"networks": [{"uuid": "ok"}]}})
    with pytest.raises(HostileInput, match=r"server\.networks\[0\]\.uuid"):
        check_document({"server": {"networks": [{"uuid": "a\x00"}]}})
    with pytest.raises(HostileInput, match="field name"):
        check_document({"server": {"bad\ud800": 1}})
    document: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        document = [document]
    with pytest.raises(HostileInput, match="nested too deeply"):
        check_document(document)


def _scope(path: str = "/v2.1/servers", query: bytes = b"") -> Scope:
    return {"type": "http", "path": path, "query_string": query, "headers": []}


def test_urls_are_checked_path_and_query() -> None:
    check_url(_scope(query=b"name=web%2D1&status=ACTIVE"))
    with pytest.raises(HostileInput, match="URL path"):
        check_url(_scope(path="/v2.1/servers/a\x00"))
    with pytest.raises(HostileInput, match="query parameter name"):
        check_url(_scope(query=b"name=a%00b"))
    with pytest.raises(HostileInput, match="query parameter"):
        check_url(_scope(query=b"a%00=1"))


class _Echo:
    """An application that answers with the body it read."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def _client(limit: int = 1024) -> httpx.AsyncClient:
    app = InputGuard(_Echo(), max_body_bytes=limit)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_the_app_reads_the_body_it_was_sent() -> None:
    async with _client() as client:
        response = await client.post("/x", content=b'{"name": "web-1"}')
    assert response.content == b'{"name": "web-1"}'


async def test_bodies_over_the_limit_are_413_declared_or_chunked() -> None:
    async def chunks() -> Any:
        for _ in range(4):
            yield b"x" * 300

    async with _client() as client:
        declared = await client.post("/x", content=b"x" * 1025)
        chunked = await client.post("/x", content=chunks())
        exact = await client.post("/x", content=b"x" * 1024)
    for response in (declared, chunked):
        assert response.status_code == 413
        assert response.json()["overLimit"]["code"] == 413
    assert exact.status_code == 200


async def test_hostile_bodies_are_400_before_the_app() -> None:
    async with _client() as client:
        response = await client.post("/x", content=json.dumps({"name": "a\x00"}).encode())
    assert response.status_code == 400
    assert "name" in response.json()["badRequest"]["message"]


async def test_a_client_that_goes_away_mid_body_gets_no_answer() -> None:
    sent: list[Message] = []
    messages: Iterator[Message] = iter(
        [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}]
    )

    async def receive() -> Message:
        return next(messages)

    async def send(message: Message) -> None:
        sent.append(message)

    await InputGuard(_Echo(), max_body_bytes=1024)(_scope(), receive, send)
    assert sent == []
