"""``os-keypairs``: each user's named public keys, imported or generated.

A key pair is imported when the request carries ``public_key``, and generated
otherwise (the private key is in the create answer, and only there). ``type`` (``ssh``
or ``x509``) exists from 2.2, which also answers create with 201 and delete with 204;
from 2.10 an admin may act on another user's key pairs with ``user_id``; from 2.35 the
list pages with ``limit`` and ``marker``. Names are 1-255 letters, digits, spaces,
``_`` and ``-`` (from 2.92 ``@`` and ``.`` too). From 2.92 keel no longer generates key
pairs: a create must carry the ``public_key`` to import, as in Nova. Creating one counts
against the ``key_pairs`` quota of the caller's project, per user.
"""

from __future__ import annotations

import asyncio
import string
from typing import Any
from urllib.parse import urlencode

import asyncpg
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool, RequestLinks, Version
from services.api.http.faults import BadRequest, ConflictingRequest, Forbidden, ItemNotFound
from services.api.http.microversion import APIVersion
from services.api.http.paging import marker_not_found, next_marker, page_request
from services.api.http.query import refuse_unknown
from services.api.resources import key_material
from services.api.resources.quotas import check_new_key_pair
from services.api.views.timestamps import naive_isotime
from shared.context import RequestContext
from shared.db import key_pairs
from shared.exceptions import AlreadyExists, KeyPairNotFound
from shared.objects.key_pair import KeyPair, KeyPairType

router = APIRouter(prefix="/v2.1/os-keypairs")

NAME_CHARACTERS = frozenset("_- " + string.digits + string.ascii_letters)
#: What names may hold from 2.92, which also stops generating key pairs.
NAME_CHARACTERS_2_92 = NAME_CHARACTERS | {"@", "."}
IMPORT_ONLY_VERSION = "2.92"
MAX_NAME = 255


class NewKeyPair(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    public_key: str | None = None
    type: KeyPairType | None = None
    user_id: str | None = None


class NewKeyPairBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keypair: NewKeyPair


def check_name(name: str, version: APIVersion) -> str:
    if not 1 <= len(name) <= MAX_NAME:
        raise BadRequest(
            "Keypair data is invalid: Keypair name must be string and between 1 and 255 "
            "characters long"
        )
    newer = version.at_least(IMPORT_ONLY_VERSION)
    allowed = NAME_CHARACTERS_2_92 if newer else NAME_CHARACTERS
    if name != name.strip() or not set(name) <= allowed:
        raise BadRequest(
            f"Invalid input for field/attribute name. Value: {name}. Only expected characters: "
            f"letters, digits, spaces, '_'{', @, .' if newer else ''} and '-', with no "
            "leading or trailing space."
        )
    return name


def check_fields(new: NewKeyPair, version: APIVersion) -> None:
    """Fields a microversion does not know are refused, as unknown fields are."""
    for field, since in (("type", "2.2"), ("user_id", "2.10")):
        if field in new.model_fields_set and not version.at_least(since):
            raise BadRequest(
                "Invalid input for field/attribute keypair. Additional properties are not "
                f"allowed ('{field}' was unexpected) before microversion {since}."
            )


def owner(ctx: RequestContext, version: APIVersion, user_id: str | None) -> str:
    """Whose key pairs a request acts on: the caller's, or (admins, 2.10) ``user_id``'s."""
    if user_id is None or not version.at_least("2.10"):
        return ctx.user_id or ""
    if user_id != ctx.user_id and not ctx.is_admin:
        raise Forbidden(
            "Policy doesn't allow acting on another user's key pairs: it needs the admin role."
        )
    return user_id


def keypair_body(key: KeyPair, version: APIVersion, *, full: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": key.name,
        "public_key": key.public_key,
        "fingerprint": key.fingerprint,
    }
    if full:
        body.update(
            user_id=key.user_id,
            created_at=naive_isotime(key.created_at),
            updated_at=None,
            deleted=False,
            deleted_at=None,
            id=key.id,
        )
    if version.at_least("2.2"):
        body["type"] = key.type.value
    return body


async def _material(
    new: NewKeyPair, key_type: KeyPairType, user_id: str
) -> tuple[str, str, str | None]:
    """Public key, fingerprint and (when generated) private key."""
    if new.public_key is not None:
        public = new.public_key.strip()
        try:
            return public, key_material.fingerprint(key_type, public), None
        except key_material.InvalidKey as exc:
            raise BadRequest(f"Keypair data is invalid: {exc}") from None
    made = await asyncio.to_thread(key_material.generate, key_type, user_id)
    return made.public_key, made.fingerprint, made.private_key


@router.post("")
async def create(
    body: NewKeyPairBody, pool: DbPool, ctx: Context, version: Version, settings: AppSettings
) -> Response:
    new = body.keypair
    check_fields(new, version)
    if new.public_key is None and version.at_least(IMPORT_ONLY_VERSION):
        raise BadRequest(
            "Invalid input for field/attribute keypair. 'public_key' is a required property: "
            f"key pairs are imported, not generated, from microversion {IMPORT_ONLY_VERSION}."
        )
    name, user_id = check_name(new.name, version), owner(ctx, version, new.user_id)
    key_type = new.type or KeyPairType.SSH
    public, fingerprint, private = await _material(new, key_type, user_id)
    async with pool.acquire() as conn, conn.transaction():
        await check_new_key_pair(conn, ctx.project_id or "", user_id, settings.quota)
        try:
            key = await key_pairs.create(
                conn,
                user_id=user_id,
                name=name,
                key_type=key_type,
                public_key=public,
                fingerprint=fingerprint,
            )
        except AlreadyExists as exc:
            raise ConflictingRequest(exc.message) from None
    answer = keypair_body(key, version, full=False)
    answer["user_id"] = key.user_id
    if private is not None:
        answer["private_key"] = private
    return JSONResponse({"keypair": answer}, status_code=201 if version.at_least("2.2") else 200)


@router.get("")
async def list_keypairs(
    request: Request, pool: DbPool, ctx: Context, version: Version, links: RequestLinks
) -> dict[str, Any]:
    params = request.query_params
    refuse_unknown(params, {"user_id", "limit", "marker"}, version)
    user_id = owner(ctx, version, params.get("user_id"))
    paging = page_request(params.get("limit"), params.get("marker"))
    if not version.at_least("2.35"):
        paging = page_request(None, None)
    try:
        async with pool.acquire() as conn:
            found = await key_pairs.list_page(
                conn, user_id, marker=paging.marker, limit=paging.limit
            )
    except KeyPairNotFound:
        raise marker_not_found(str(paging.marker)) from None
    body: dict[str, Any] = {
        "keypairs": [{"keypair": keypair_body(k, version, full=False)} for k in found]
    }
    after = next_marker(found, paging, key=lambda k: k.name)
    if after is not None and paging.limited:
        params_out = [("limit", str(paging.limit)), ("marker", after)]
        if user_id != ctx.user_id:
            params_out.append(("user_id", user_id))
        href = f"{links.compute('os-keypairs')}?{urlencode(params_out)}"
        body["keypairs_links"] = [{"rel": "next", "href": href}]
    return body


async def _find(pool: asyncpg.Pool, user_id: str, name: str) -> KeyPair:
    try:
        async with pool.acquire() as conn:
            return await key_pairs.get(conn, user_id, name)
    except KeyPairNotFound as exc:
        raise ItemNotFound(exc.message) from None


@router.get("/{name}")
async def show(
    name: str, request: Request, pool: DbPool, ctx: Context, version: Version
) -> dict[str, Any]:
    refuse_unknown(request.query_params, {"user_id"}, version)
    user_id = owner(ctx, version, request.query_params.get("user_id"))
    key = await _find(pool, user_id, name)
    return {"keypair": keypair_body(key, version, full=True)}


@router.delete("/{name}", response_class=Response)
async def delete(
    name: str, request: Request, pool: DbPool, ctx: Context, version: Version
) -> Response:
    refuse_unknown(request.query_params, {"user_id"}, version)
    user_id = owner(ctx, version, request.query_params.get("user_id"))
    try:
        async with pool.acquire() as conn:
            await key_pairs.delete(conn, user_id, name)
    except KeyPairNotFound as exc:
        raise ItemNotFound(exc.message) from None
    return Response(status_code=204 if version.at_least("2.2") else 202)
