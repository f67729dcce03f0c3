"""``/identity/v3/auth/tokens``: issue a token for a password, validate it, revoke it.

A token is issued for a user (by id, or by name in the default domain) whose password
matches, scoped to a project they hold a role in (by id or by name; without a scope,
their default project). It answers 201 with the token in ``X-Subject-Token`` and a body
naming the user, project, roles, expiry and the service catalog. Every failure to
authenticate is the same 401, whatever was wrong, so it tells a guesser nothing.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from services.api.http.auth import TOKEN_HEADER, Context
from services.api.http.deps import AppSettings, DbPool, RequestLinks
from services.api.http.faults import Forbidden, ItemNotFound, Unauthorized
from services.api.identity import views
from services.api.identity.verified import VerifiedPasswords
from shared.context import RequestContext
from shared.db import tokens, users
from shared.db.pool import Connection
from shared.exceptions import NotFound
from shared.objects.identity import (
    DEFAULT_DOMAIN_ID,
    DEFAULT_DOMAIN_NAME,
    IssuedToken,
    Membership,
    User,
)
from shared.passwords import decoy_hash, verify_password

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/identity/v3/auth")

SUBJECT_HEADER = "X-Subject-Token"
#: Random bytes in an issued token (it is sent base64-encoded).
TOKEN_BYTES = 32


async def get_verified(request: Request) -> VerifiedPasswords:
    """The passwords this keel-api verified lately (:mod:`services.api.identity.verified`)."""
    verified: VerifiedPasswords = request.app.state.verified_passwords
    return verified


#: A route parameter: the passwords this keel-api verified lately.
Verified = Annotated[VerifiedPasswords, Depends(get_verified)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class DomainRef(_Lenient):
    id: str | None = None
    name: str | None = None


class PasswordUser(_Lenient):
    id: str | None = None
    name: str | None = None
    domain: DomainRef | None = None
    password: str = Field(max_length=4096)


class PasswordMethod(_Lenient):
    user: PasswordUser


class IdentityPart(_Lenient):
    methods: list[str]
    password: PasswordMethod | None = None


class ProjectRef(_Lenient):
    id: str | None = None
    name: str | None = None
    domain: DomainRef | None = None


class Scope(_Lenient):
    project: ProjectRef | None = None


class Auth(_Lenient):
    identity: IdentityPart
    scope: Scope | None = None


class AuthBody(_Lenient):
    auth: Auth


def in_default_domain(ref: DomainRef | None) -> bool:
    """True if ``ref`` names the default domain (or names none)."""
    if ref is None:
        return True
    if ref.id is not None:
        return ref.id == DEFAULT_DOMAIN_ID
    return ref.name is None or ref.name.lower() == DEFAULT_DOMAIN_NAME.lower()


async def check_password(
    conn: Connection, given: PasswordUser, verified: VerifiedPasswords
) -> User:
    """The user whose password this is; 401 otherwise.

    The row is read every time, so a disabled or deleted user, or a changed password, is
    refused at once; a password that verified against the same stored hash before skips
    scrypt (:mod:`services.api.identity.verified`). Any other attempt — unknown user,
    disabled user, wrong password — spends one scrypt run, so the time taken tells a
    guesser nothing.
    """
    if given.id is None and given.name is None:
        raise Unauthorized("Authentication needs the user's id or name.")
    found = None
    if in_default_domain(given.domain):
        found = await users.password_hash(conn, user_id=given.id, name=given.name)
    stored = found[1] if found is not None else None
    if found is None or not stored:
        await asyncio.to_thread(verify_password, given.password, decoy_hash())
        LOG.info("refusing a token: unknown user or wrong password for %s", given.name or given.id)
        raise Unauthorized()
    user = found[0]
    if not user.enabled:
        verified.forget(user.id)
        await asyncio.to_thread(verify_password, given.password, stored)
        LOG.info("refusing a token: user %s is disabled", user.name)
        raise Unauthorized()
    if not await verified.verify(user.id, stored, given.password):
        LOG.info("refusing a token: unknown user or wrong password for %s", given.name or given.id)
        raise Unauthorized()
    return user


async def scope_to(conn: Connection, user: User, scope: Scope | None) -> Membership:
    """The user's roles in the project asked for (default: their default project), which
    must be enabled."""
    wanted = scope.project if scope is not None else None
    membership = None
    if wanted is not None:
        if not in_default_domain(wanted.domain) or (wanted.id is None and wanted.name is None):
            raise Unauthorized("keel scopes tokens to a project of the Default domain only.")
        if wanted.id is not None:
            membership = await tokens.membership_in(conn, user, wanted.id)
        else:
            membership = await tokens.membership_in(conn, user, str(wanted.name), by_name=True)
    elif user.default_project_id is not None:
        membership = await tokens.membership_in(conn, user, user.default_project_id)
    if membership is None:
        LOG.info("refusing a token: user %s has no role in the project asked for", user.name)
        raise Unauthorized("The user has no role in the requested project.")
    if not membership.project.enabled:
        LOG.info("refusing a token: project %s is disabled", membership.project.name)
        raise Unauthorized("The requested project is disabled.")
    return membership


def _subject_response(token: str, body: dict[str, Any], status: int) -> Response:
    return JSONResponse(body, status_code=status, headers={SUBJECT_HEADER: token})


@router.post("/tokens", status_code=201)
async def issue(
    body: AuthBody, pool: DbPool, settings: AppSettings, links: RequestLinks, verified: Verified
) -> Response:
    identity = body.auth.identity
    if "password" not in identity.methods or identity.password is None:
        raise Unauthorized("keel issues tokens for the password method only.")
    async with pool.acquire() as conn:
        user = await check_password(conn, identity.password.user, verified)
        membership = await scope_to(conn, user, body.auth.scope)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        expires = datetime.now(UTC) + timedelta(seconds=settings.identity.token_expiration)
        audit_id = secrets.token_urlsafe(16)
        try:
            issued = await tokens.issue(conn, token, membership, audit_id, expires)
        except NotFound:
            raise Unauthorized() from None
    LOG.info(
        "issued a token to user %s for project %s (%s), expiring %s",
        user.name,
        membership.project.name,
        ", ".join(membership.role_names),
        views.timestamp(issued.expires_at),
    )
    return _subject_response(token, views.token(issued, links, settings.identity.region), 201)


async def _subject(
    request: Request, pool: asyncpg.Pool, ctx: RequestContext
) -> tuple[str, IssuedToken]:
    """The token named in ``X-Subject-Token`` and what it stands for; 404 if not valid."""
    subject = request.headers.get(SUBJECT_HEADER)
    if not subject:
        raise ItemNotFound(f"Could not find token: the request has no {SUBJECT_HEADER} header.")
    if not ctx.is_admin and subject != request.headers.get(TOKEN_HEADER):
        raise Forbidden("Only an admin may validate or revoke another user's token.")
    async with pool.acquire() as conn:
        issued = await tokens.find_valid(conn, subject)
    if issued is None:
        raise ItemNotFound("Could not find token: it is unknown, expired or revoked.")
    return subject, issued


@router.get("/tokens")
async def validate(
    request: Request, ctx: Context, pool: DbPool, settings: AppSettings, links: RequestLinks
) -> Response:
    subject, issued = await _subject(request, pool, ctx)
    return _subject_response(subject, views.token(issued, links, settings.identity.region), 200)


@router.head("/tokens")
async def check(request: Request, ctx: Context, pool: DbPool) -> Response:
    subject, _ = await _subject(request, pool, ctx)
    return Response(status_code=200, headers={SUBJECT_HEADER: subject})


@router.delete("/tokens", status_code=204, response_class=Response)
async def revoke(request: Request, ctx: Context, pool: DbPool) -> Response:
    subject, issued = await _subject(request, pool, ctx)
    async with pool.acquire() as conn:
        await tokens.revoke(conn, subject)
    LOG.info("revoked a token of user %s", issued.membership.user.name)
    return Response(status_code=204)
