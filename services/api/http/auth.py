"""Who is asking: the request's token, turned into a request context.

``X-Auth-Token`` is looked up first in ``settings.auth.tokens`` (static tokens: token →
user, project, roles), then among the tokens the identity API issued (valid while
unexpired and while the user keeps a role in the token's project) or, behind Keystone
(``KEEL_IDENTITY__KEYSTONE_URL``), validated by Keystone (:mod:`services.api.keystone`).
A missing or unknown token is a 401; a route that needs the ``admin`` role answers
members with a 403.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Annotated

import asyncpg
from fastapi import Depends, Request

from services.api.http.faults import Forbidden, Unauthorized
from services.api.keystone.tokens import KeystoneTokens
from shared.config import AuthSettings, Settings, TokenInfo
from shared.context import RequestContext, new_request_id
from shared.db import tokens

LOG = logging.getLogger(__name__)

TOKEN_HEADER = "X-Auth-Token"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def find_token(auth: AuthSettings, token: str) -> TokenInfo | None:
    """The identity ``token`` stands for.

    The secret is never used as a lookup key: the given token is compared with every
    configured one, in constant time, as digests of one length, so neither the time
    taken nor an early exit tells how much of a token, or of its length, was right.
    """
    found = None
    given = _digest(token)
    for known, info in auth.tokens.items():
        if hmac.compare_digest(_digest(known), given):
            found = info
    return found


def context_for(info: TokenInfo, request_id: str) -> RequestContext:
    return RequestContext(
        request_id=request_id,
        user_id=info.user_id,
        project_id=info.project_id,
        roles=tuple(info.roles),
    )


async def issued_token(request: Request, token: str) -> TokenInfo | None:
    """The identity a token issued by the identity API stands for, if it is valid."""
    pool: asyncpg.Pool = request.app.state.pool
    async with pool.acquire() as conn:
        issued = await tokens.find_valid(conn, token)
    if issued is None:
        return None
    membership = issued.membership
    return TokenInfo(
        user_id=membership.user.id,
        project_id=membership.project.id,
        roles=list(membership.role_names),
    )


async def identify(request: Request, token: str) -> TokenInfo | None:
    """A static token's identity, else Keystone's answer (behind Keystone) or an issued
    token's (the embedded identity)."""
    settings: Settings = request.app.state.settings
    info = find_token(settings.auth, token)
    if info is not None:
        return info
    keystone: KeystoneTokens | None = request.app.state.keystone
    if keystone is not None:
        return await keystone.identify(token)
    return await issued_token(request, token)


async def authenticate(request: Request) -> RequestContext:
    """The request's context; 401 unless it carries a known token."""
    token = request.headers.get(TOKEN_HEADER)
    info = None
    if token:
        info = await identify(request, token)
    if info is None:
        LOG.info(
            "refusing %s %s: %s",
            request.method,
            request.url.path,
            "unknown token" if token else "no X-Auth-Token header",
        )
        raise Unauthorized()
    request_id = getattr(request.state, "request_id", None) or new_request_id()
    return context_for(info, request_id)


async def require_admin(ctx: Annotated[RequestContext, Depends(authenticate)]) -> RequestContext:
    """The request's context; 403 unless it has the ``admin`` role."""
    if not ctx.is_admin:
        raise Forbidden(
            "Policy doesn't allow this action to be performed: it needs the admin role."
        )
    return ctx


#: A route parameter: the authenticated caller.
Context = Annotated[RequestContext, Depends(authenticate)]
#: A route parameter: the authenticated caller, who must be an admin.
AdminContext = Annotated[RequestContext, Depends(require_admin)]
