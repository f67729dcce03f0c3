"""``/ops/``: the operator's page, its login and logout, and its two static files.

``GET /ops/`` shows an admin the page (its script then polls :mod:`services.api.ops.data`)
and anyone else the login form, with no data. ``POST /ops/login`` takes a user name and
password: an admin gets a session (:mod:`services.api.ops.session`) and is sent to the
page; anyone else — unknown user, wrong password, or a user who is not an admin — gets
the form again with one message that does not say which (403). ``POST /ops/logout`` ends
the session.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from datetime import UTC, datetime, timedelta
from importlib import resources
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from services.api.http.deps import AppSettings, DbPool
from services.api.http.faults import Fault, ItemNotFound
from services.api.identity.tokens import PasswordUser, check_password, get_verified
from services.api.ops import html
from services.api.ops.session import (
    CSRF_FIELD,
    SESSION_COOKIE,
    MaybeOperator,
    clear_session_cookie,
    csrf_token,
    same_origin,
    set_session_cookie,
)
from shared.db import role_assignments, tokens
from shared.db.pool import Connection
from shared.objects.identity import ADMIN_ROLE, Membership, User

LOG = logging.getLogger(__name__)

router = APIRouter()

REFUSED = "Sign-in refused: unknown user, wrong password, or not an admin."
#: Static files and their media types; nothing else is served from the package.
STATIC = {"ops.js": "text/javascript", "ops.css": "text/css"}
#: Bytes of a login form read at most.
MAX_FORM = 4096
_SESSION_BYTES = 32


@router.get("/ops", include_in_schema=False)
async def bare() -> Response:
    return RedirectResponse("/ops/", status_code=308)


@router.get("/ops/", include_in_schema=False)
async def page(operator: MaybeOperator) -> Response:
    if operator is None:
        return HTMLResponse(html.login_page())
    return HTMLResponse(html.ops_page(user=operator.name, csrf=operator.csrf or ""))


async def _form(request: Request) -> dict[str, str]:
    """The fields of a urlencoded form body (the first of each name); 400 otherwise."""
    kind = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    body = await request.body()
    if kind != "application/x-www-form-urlencoded" or len(body) > MAX_FORM:
        raise Fault(400, "Send the form as application/x-www-form-urlencoded.")
    try:
        pairs = parse_qsl(body.decode("utf-8"), strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise Fault(400, "The form could not be read.") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


async def _admin_membership(conn: Connection, user: User) -> Membership | None:
    """The user's roles in a project where they are an admin (their default project
    first); ``None`` if they are an admin nowhere."""
    held = await role_assignments.list_assignments(conn, user_id=user.id)
    projects = sorted({a.project_id for a in held}, key=lambda p: p != user.default_project_id)
    for project_id in projects:
        membership = await tokens.membership_of(conn, user.id, project_id)
        if membership is not None and ADMIN_ROLE in membership.role_names:
            return membership
    return None


def _refused(username: str) -> Response:
    return HTMLResponse(html.login_page(message=REFUSED, username=username), status_code=403)


@router.post("/ops/login", include_in_schema=False)
async def login(request: Request, pool: DbPool, settings: AppSettings) -> Response:
    if not same_origin(request):
        return _refused("")
    fields = await _form(request)
    username = fields.get("username", "")[:255]
    password = fields.get("password", "")
    if not username or not password or request.app.state.keystone is not None:
        # Behind Keystone keel has no users of its own: scripts send Keystone's tokens.
        return _refused(username)
    async with pool.acquire() as conn:
        try:
            user = await check_password(
                conn, PasswordUser(name=username, password=password), await get_verified(request)
            )
        except Fault:
            return _refused(username)
        membership = await _admin_membership(conn, user)
        if membership is None:
            LOG.info("refusing a sign-in to the operator's page: %s is not an admin", username)
            return _refused(username)
        session = secrets.token_urlsafe(_SESSION_BYTES)
        expires = datetime.now(UTC) + timedelta(seconds=settings.ops.session_lifetime)
        await tokens.issue(conn, session, membership, f"ops-{secrets.token_hex(8)}", expires)
    LOG.info("%s signed in to the operator's page until %s", username, expires.isoformat())
    response = RedirectResponse("/ops/", status_code=303)
    set_session_cookie(response, session, settings)
    return response


@router.post("/ops/logout", include_in_schema=False)
async def logout(request: Request, pool: DbPool, settings: AppSettings) -> Response:
    session = request.cookies.get(SESSION_COOKIE)
    fields = await _form(request)
    given = fields.get(CSRF_FIELD, "")
    if (
        session
        and same_origin(request)
        and hmac.compare_digest(given.encode(), csrf_token(session).encode())
    ):
        async with pool.acquire() as conn:
            await tokens.revoke(conn, session)
        LOG.info("a session of the operator's page ended by its user")
    response = RedirectResponse("/ops/", status_code=303)
    clear_session_cookie(response, settings)
    return response


@router.get("/ops/static/{name}", include_in_schema=False)
async def static(name: str) -> Response:
    media = STATIC.get(name)
    if media is None:
        raise ItemNotFound(f"No such file: {name[:60]}")
    text = resources.files("services.api.ops").joinpath("static", name).read_text("utf-8")
    return Response(text, media_type=media, headers={"Cache-Control": "no-cache"})
