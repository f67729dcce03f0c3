"""Hostile input stopped before any route sees it, the same way for every route.

:class:`InputGuard` is pure ASGI middleware. For every HTTP request it

* refuses a body larger than ``max_body_bytes`` with 413: at once when
  ``Content-Length`` says so, while reading when the body comes in chunks;
* refuses with 400 text PostgreSQL cannot store or that is not valid Unicode: a NUL
  character or an unpaired surrogate anywhere in the URL path, the query string, or a
  JSON body (keys and values, at any depth);
* refuses with 400 a JSON body with numbers no column can hold (integers beyond 64
  bits, ``NaN``, infinities, overflowing floats) or nested deeper than
  :data:`MAX_DEPTH`.

A body that is not JSON at all is passed on untouched: the route's own validation
answers it. Field-level ranges (a flavor's RAM fits a 32-bit column…) belong to the
request models; this guard is the net under all of them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.http.bounds import INT8_MAX, INT8_MIN
from services.api.http.faults import fault_response

#: Levels of nesting a JSON body may have; no request keel understands needs more.
MAX_DEPTH = 32
#: Characters of a field path or name echoed in a message.
_LABEL_LIMIT = 60
#: Decimal digits of the largest 64-bit integer.
_INT8_DIGITS = len(str(INT8_MAX))


class HostileInput(Exception):
    """What is wrong with a request, as the 400 message says it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _label(text: str) -> str:
    """A name from the request, safe to echo: escaped, bounded."""
    escaped = json.dumps(text)[1:-1]
    return escaped if len(escaped) <= _LABEL_LIMIT else escaped[: _LABEL_LIMIT - 3] + "..."


def text_problem(text: str) -> str | None:
    """Why PostgreSQL could not store ``text``, or ``None`` if it can."""
    if "\x00" in text:
        return "it contains a NUL character (\\u0000), which is not allowed in text"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = _label(text[exc.start : exc.end])
        return f"it contains an unpaired surrogate ({bad}), which is not valid Unicode"
    return None


def _parse_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > _INT8_DIGITS or not INT8_MIN <= int(text) <= INT8_MAX:
        raise HostileInput(
            f"The request body has an integer out of range ({_label(text)}): "
            f"integers must lie between {INT8_MIN} and {INT8_MAX}."
        )
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise HostileInput(f"The request body has a number out of range ({_label(text)}).")
    return value


def _parse_constant(name: str) -> Any:
    raise HostileInput(f"The request body has {name}, which is not a number keel accepts.")


def parse_body(body: bytes) -> tuple[bool, Any]:
    """``(True, document)`` for a JSON body, ``(False, None)`` for anything else.

    Raises :class:`HostileInput` for JSON with numbers out of range or too deep.
    """
    try:
        document = json.loads(
            body,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except RecursionError:
        raise HostileInput(
            f"The request body is nested too deeply (at most {MAX_DEPTH} levels)."
        ) from None
    except ValueError:  # not JSON (UnicodeDecodeError included): the route answers it
        return False, None
    return True, document


def _children(value: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            problem = text_problem(key)
            if problem:
                name = _label(key)
                raise HostileInput(f"Invalid field name {name} in the request body: {problem}.")
            yield item, f"{path}.{key}" if path else key
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield item, f"{path}[{index}]"


def check_document(document: Any) -> None:
    """Raise :class:`HostileInput` for the first string PostgreSQL could not store."""
    stack: list[tuple[Any, str, int]] = [(document, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise HostileInput(
                f"The request body is nested too deeply (at most {MAX_DEPTH} levels)."
            )
        if isinstance(value, str):
            problem = text_problem(value)
            if problem:
                where = _label(path) if path else "the request body"
                raise HostileInput(f"Invalid input for field/attribute {where}: {problem}.")
            continue
        children = list(_children(value, path))
        stack.extend((item, child, depth + 1) for item, child in reversed(children))


def check_url(scope: Scope) -> None:
    """Raise :class:`HostileInput` for text in the path or query PostgreSQL could not store."""
    problem = text_problem(scope["path"])
    if problem:
        raise HostileInput(f"Invalid URL path: {problem}.")
    query = scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        problem = text_problem(name) or text_problem(value)
        if problem:
            raise HostileInput(f"Invalid query parameter {_label(name)}: {problem}.")


class BodyTooLarge(Exception):
    pass


def declared_length(headers: Headers) -> int | None:
    """``Content-Length`` as a number (``None`` if absent or not a number)."""
    value = headers.get("content-length", "").strip()
    if not value.isdigit():
        return None
    # A length with more digits than any real body has is simply too large.
    return int(value) if len(value) <= 18 else INT8_MAX


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or ``None`` if the client went away while sending it."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the client's events."""
    pending = True

    async def receive_again() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again


#: Uploads of image data (a user's, or an agent's snapshot through its signed URL):
#: streamed by their route, never read whole here.
IMAGE_DATA = re.compile(r"^/image/(v2/images/[^/]+/file|upload/[^/]+)$")


class InputGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self) -> str:
        return (
            f"The request body is larger than {self.max_body_bytes} bytes, "
            "the most keel-api accepts."
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("method") == "PUT" and IMAGE_DATA.match(scope.get("path", "")):
            # Image data streams to the image store under its own size limit.
            try:
                check_url(scope)
            except HostileInput as exc:
                await fault_response(400, exc.message)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        try:
            check_url(scope)
            declared = declared_length(Headers(scope=scope))
            if declared is not None and declared > self.max_body_bytes:
                raise BodyTooLarge
            body = await read_body(receive, self.max_body_bytes)
            if body is None:
                return
            is_json, document = parse_body(body) if body else (False, None)
            if is_json:
                check_document(document)
        except HostileInput as exc:
            await fault_response(400, exc.message)(scope, receive, send)
            return
        except BodyTooLarge:
            await fault_response(413, self._too_large())(scope, receive, send)
            return
        await self.app(scope, replay(body, receive), send)
