"""A flavor's extra specs: ``/flavors/{id}/os-extra_specs[/{key}]``.

Anyone who may see the flavor lists its specs or reads one; admins add or change specs
(``POST`` with ``{"extra_specs": {...}}``, or ``PUT`` of one key with ``{key: value}``)
and delete one. Keys are 1-255 of ``[A-Za-z0-9-_:. ]``, values strings (or numbers,
kept as their text) of at most 255 characters, as Nova's schema says. From microversion
2.86 the specs Nova knows are checked too (:mod:`services.api.resources.extra_spec_rules`):
a known key with a value it cannot take, or an unknown key in a known namespace, is a
400. A server keeps the specs its flavor had when it was created.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from services.api.http.auth import AdminContext, Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool, Version
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.microversion import APIVersion
from services.api.resources import extra_spec_rules
from services.api.resources.extra_spec_rules import VALIDATION_VERSION
from services.api.resources.flavors import visible_flavor
from shared.db import flavors as flavors_db

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/flavors")

_KEY = re.compile(r"[a-zA-Z0-9-_:. ]{1,255}")
MAX_VALUE = 255


def parse_specs(given: object, version: APIVersion) -> dict[str, str]:
    """``{key: value}`` as Nova's schema takes it; values as text, checked from 2.86."""
    if not isinstance(given, dict):
        raise BadRequest("Invalid input for field/attribute extra_specs: it must be an object.")
    specs: dict[str, str] = {}
    for key, value in given.items():
        if not _KEY.fullmatch(key):
            raise BadRequest(
                f"Invalid input for field/attribute extra_specs: key {key[:60]!r} must be "
                "1 to 255 letters, digits, spaces or '-_:.'."
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise BadRequest(
                f"Invalid input for field/attribute extra_specs: the value of {key!r} must "
                "be a string or a number."
            )
        text = value if isinstance(value, str) else str(value)
        if len(text) > MAX_VALUE:
            raise BadRequest(
                f"Invalid input for field/attribute extra_specs: the value of {key!r} is "
                f"longer than {MAX_VALUE} characters."
            )
        if version.at_least(VALIDATION_VERSION):
            extra_spec_rules.check(key, text)
        specs[key] = text
    return specs


def _no_such_key(flavor_id: str, key: str) -> ItemNotFound:
    return ItemNotFound(f"Flavor {flavor_id} has no extra specs with key {key}.")


@router.get("/{flavor_id}/os-extra_specs", dependencies=[NO_QUERY_FROM_2_102])
async def list_extra_specs(flavor_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    async with pool.acquire() as conn:
        flavor = await visible_flavor(conn, ctx, flavor_id)
    return {"extra_specs": {str(k): str(v) for k, v in flavor.extra_specs.items()}}


@router.post("/{flavor_id}/os-extra_specs")
async def add_extra_specs(
    flavor_id: str,
    body: Annotated[Any, Body()],
    *,
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
) -> dict[str, Any]:
    if not isinstance(body, dict) or set(body) != {"extra_specs"}:
        raise BadRequest('The request body must be {"extra_specs": {KEY: VALUE, ...}}.')
    specs = parse_specs(body["extra_specs"], version)
    async with pool.acquire() as conn:
        await flavors_db.merge_extra_specs(conn, flavor_id, specs)
    LOG.info("flavor %s: extra specs %s set", flavor_id, sorted(specs))
    return {"extra_specs": specs}


@router.get("/{flavor_id}/os-extra_specs/{key}", dependencies=[NO_QUERY_FROM_2_102])
async def show_extra_spec(flavor_id: str, key: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    async with pool.acquire() as conn:
        flavor = await visible_flavor(conn, ctx, flavor_id)
    if key not in flavor.extra_specs:
        raise _no_such_key(flavor_id, key)
    return {key: str(flavor.extra_specs[key])}


@router.put("/{flavor_id}/os-extra_specs/{key}")
async def update_extra_spec(
    flavor_id: str,
    key: str,
    body: Annotated[Any, Body()],
    *,
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
) -> dict[str, Any]:
    specs = parse_specs(body, version)
    if len(specs) != 1:
        raise BadRequest("Request body must hold exactly one extra spec.")
    if key not in specs:
        raise BadRequest("Request body and URI mismatch")
    async with pool.acquire() as conn:
        await flavors_db.merge_extra_specs(conn, flavor_id, specs)
    LOG.info("flavor %s: extra spec %s set", flavor_id, key)
    return specs


@router.delete("/{flavor_id}/os-extra_specs/{key}", response_class=Response)
async def delete_extra_spec(flavor_id: str, key: str, pool: DbPool, ctx: AdminContext) -> Response:
    async with pool.acquire() as conn:
        await flavors_db.get(conn, flavor_id)
        if not await flavors_db.delete_extra_spec(conn, flavor_id, key):
            raise _no_such_key(flavor_id, key)
    LOG.info("flavor %s: extra spec %s deleted", flavor_id, key)
    return Response(status_code=200)
