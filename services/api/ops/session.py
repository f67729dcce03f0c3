"""Who may use the operator's page: an admin, by a login session or by ``X-Auth-Token``.

* **A session** starts when an admin logs in with their user name and password (checked
  by the identity API's own password check). It is a token of the identity API
  (:mod:`shared.db.tokens`): random, stored only as a digest, valid for
  ``KEEL_OPS__SESSION_LIFETIME`` seconds, and ended at once when the user is deleted,
  changes their password or loses the admin role, or logs out. The browser holds it in
  the cookie :data:`SESSION_COOKIE`: ``HttpOnly`` (no script reads it), ``SameSite=Strict``
  (no other site's page sends it), ``Secure`` unless ``KEEL_OPS__SECURE_COOKIE`` is off,
  path ``/ops``, with the same lifetime.
* **CSRF.** Every ``POST`` made with a session carries its CSRF token — an HMAC of the
  session token, so it needs no storage and dies with the session — in the
  ``X-CSRF-Token`` header or a ``csrf_token`` form field; and a request whose ``Origin``
  is another site's is refused. A request with ``X-Auth-Token`` is not a browser's and
  needs neither.
* **Scripts** send ``X-Auth-Token`` with any admin token keel-api accepts.

Anyone else is an :data:`Operator` of ``None``: the page shows them its login form and
the data routes answer 401 (no token) or 403 (not an admin), never any data.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

import asyncpg
from fastapi import Depends, Request, Response

from services.api.http.auth import TOKEN_HEADER, context_for, identify
from services.api.http.faults import Forbidden, Unauthorized
from shared.config import Settings, TokenInfo
from shared.context import RequestContext, new_request_id
from shared.db import tokens

LOG = logging.getLogger(__name__)

SESSION_COOKIE = "keel_ops_session"
COOKIE_PATH = "/ops"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
_CSRF_LABEL = b"keel-ops-csrf"
#: Longest session token read from a cookie (issued ones are 43 characters).
_MAX_TOKEN = 256


def csrf_token(session: str) -> str:
    """The CSRF token of a session: an HMAC of it, so only its holder can compute it."""
    mac = hmac.new(session.encode("utf-8"), _CSRF_LABEL, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")


@dataclass(frozen=True)
class Operator:
    """An admin using the page, and how they proved it."""

    ctx: RequestContext
    #: Their user name (with a static token, the token's user id).
    name: str
    #: The session token when they came with the cookie; ``None`` with ``X-Auth-Token``.
    session: str | None = None

    @property
    def csrf(self) -> str | None:
        return None if self.session is None else csrf_token(self.session)


def _request_id(request: Request) -> str:
    found: str | None = getattr(request.state, "request_id", None)
    return found or new_request_id()


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as far as its credential tells."""

    #: ``None``: nobody known (no credential, or one keel-api does not accept).
    ctx: RequestContext | None = None
    name: str = ""
    #: The session token, when it came with the cookie.
    session: str | None = None
    #: Whether it brought a credential at all.
    presented: bool = False


async def _from_header(request: Request, token: str) -> Caller:
    info = await identify(request, token)
    if info is None:
        return Caller(presented=True)
    return Caller(context_for(info, _request_id(request)), info.user_id, presented=True)


async def _from_cookie(request: Request, session: str) -> Caller:
    issued = None
    # Behind Keystone there are no sessions: keel keeps no identity of its own.
    if len(session) <= _MAX_TOKEN and request.app.state.keystone is None:
        pool: asyncpg.Pool = request.app.state.pool
        async with pool.acquire() as conn:
            issued = await tokens.find_valid(conn, session)
    if issued is None:
        return Caller(presented=True)
    membership = issued.membership
    info = TokenInfo(
        user_id=membership.user.id,
        project_id=membership.project.id,
        roles=list(membership.role_names),
    )
    ctx = context_for(info, _request_id(request))
    return Caller(ctx, membership.user.name, session, presented=True)


async def caller(request: Request) -> Caller:
    """Who the request comes from: ``X-Auth-Token`` first, else the session cookie."""
    token = request.headers.get(TOKEN_HEADER)
    if token:
        return await _from_header(request, token)
    session = request.cookies.get(SESSION_COOKIE)
    if session:
        return await _from_cookie(request, session)
    return Caller()


async def optional_operator(request: Request) -> Operator | None:
    """The admin using the page, or ``None`` for anyone else (who sees the login form)."""
    found = await caller(request)
    if found.ctx is None or not found.ctx.is_admin:
        return None
    return Operator(found.ctx, found.name, found.session)


async def require_operator(request: Request) -> Operator:
    """The admin asking; 401 without a valid credential, 403 for anyone but an admin."""
    found = await caller(request)
    if found.ctx is None:
        LOG.info(
            "refusing %s %s: %s",
            request.method,
            request.url.path,
            "unknown token or session" if found.presented else "not signed in",
        )
        raise Unauthorized()
    if not found.ctx.is_admin:
        raise Forbidden("The operator's page is for admins only.")
    return Operator(found.ctx, found.name, found.session)


def same_origin(request: Request) -> bool:
    """False when the request says it comes from a page of another site.

    ``Origin`` decides when it names one; without it (or with ``null``, which a browser
    sends where the referrer policy withholds the origin) ``Sec-Fetch-Site`` does.
    """
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return request.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")
    parts = urlsplit(origin)
    return parts.netloc == request.headers.get("Host") and parts.scheme in ("http", "https")


async def require_operator_change(
    request: Request, operator: Annotated[Operator, Depends(require_operator)]
) -> Operator:
    """An admin's request that changes something: with a session, only from the page."""
    if operator.session is None:
        return operator
    given = request.headers.get(CSRF_HEADER, "")
    expected = operator.csrf or ""
    if not same_origin(request) or not hmac.compare_digest(given.encode(), expected.encode()):
        LOG.warning(
            "refusing %s %s by %s: no valid CSRF token, or from another site",
            request.method,
            request.url.path,
            operator.ctx.user_id,
        )
        raise Forbidden("The request did not come from the operator's page: reload it.")
    return operator


def set_session_cookie(response: Response, session: str, settings: Settings) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        session,
        max_age=int(settings.ops.session_lifetime),
        path=COOKIE_PATH,
        secure=settings.ops.secure_cookie,
        httponly=True,
        samesite="strict",
    )


def clear_session_cookie(response: Response, settings: Settings) -> None:
    response.delete_cookie(
        SESSION_COOKIE,
        path=COOKIE_PATH,
        secure=settings.ops.secure_cookie,
        httponly=True,
        samesite="strict",
    )


#: A route parameter: the admin reading the page's data.
OperatorCaller = Annotated[Operator, Depends(require_operator)]
#: A route parameter: the admin asking for a change (CSRF-checked with a session).
OperatorChange = Annotated[Operator, Depends(require_operator_change)]
#: A route parameter: the admin using the page, or ``None``.
MaybeOperator = Annotated[Operator | None, Depends(optional_operator)]
