"""Flavors: list, detail, show; admins create, describe (2.55) and delete.

Extra specs: :mod:`services.api.resources.flavor_extra_specs`.

Members see public flavors and the private ones whose access list holds their project
(:mod:`services.api.resources.flavor_access`). Admins see those too unless they pass
``is_public`` (``true``, ``false`` or ``none`` for all). ``minRam``/``minDisk``,
``limit``/``marker`` and, from 2.102, ``name`` (a regular expression) narrow the list;
``sort_key``/``sort_dir`` order it (by flavor id, ascending, unless they say otherwise).
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

import asyncpg
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.datastructures import QueryParams

from services.api.http.auth import AdminContext, Context
from services.api.http.bounds import Int4, PositiveInt4
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool, RequestLinks, Version
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.http.paging import next_marker, page_request, take_page
from services.api.http.query import refuse_unknown
from services.api.views.flavors import flavor_detail, flavor_summary
from shared.context import RequestContext
from shared.db import flavors as flavors_db
from shared.db.pool import Connection
from shared.exceptions import FlavorNotFound
from shared.objects.flavor import Flavor

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/flavors")

_FLAVOR_ID = re.compile(r"(?! )[A-Za-z0-9._ -]{1,255}(?<! )")
_TRUE = {"1", "t", "true", "on", "y", "yes"}
_FALSE = {"0", "f", "false", "off", "n", "no"}


def parse_is_public(value: str | None, *, is_admin: bool) -> bool | None:
    """Which flavors to list: public only (the default, and always for members)."""
    if not is_admin or value is None:
        return True
    lowered = value.strip().lower()
    if lowered == "none":
        return None
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise BadRequest(f"Invalid is_public filter [{value}]")


def _minimum(name: str, value: str | None) -> int:
    if value is None or value == "":
        return 0
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"Invalid {name} filter [{value}]") from None


def _name_matches(pattern: str, name: str) -> bool:
    """Nova's ``name`` filter: a regular expression found anywhere in the name."""
    try:
        return re.search(pattern, name) is not None
    except re.error as exc:
        raise BadRequest(f"Invalid regular expression in the name filter: {exc}") from None


async def may_use(conn: Connection, ctx: RequestContext, flavor: Flavor) -> bool:
    """Public flavors are everyone's; private ones are for admins and the projects on
    their access list (``os-flavor-access``)."""
    return (
        flavor.is_public
        or ctx.is_admin
        or await flavors_db.has_access(conn, flavor, ctx.project_id)
    )


async def visible_flavor(conn: Connection, ctx: RequestContext, flavor_id: str) -> Flavor:
    """The flavor, if the caller may see it; to anyone else it does not exist."""
    flavor = await flavors_db.get(conn, flavor_id)
    if not await may_use(conn, ctx, flavor):
        raise FlavorNotFound(f"Flavor {flavor_id} could not be found.")
    return flavor


Q = Annotated[str | None, Query()]


@dataclass(frozen=True)
class FlavorQuery:
    is_public: str | None
    min_ram: str | None
    min_disk: str | None
    limit: str | None
    marker: str | None
    #: A regular expression the names must match (2.102).
    name: str | None = None
    #: What to sort by and which way (``None``: by flavor id, ascending, as stored).
    sort_key: str | None = None
    descending: bool = False


#: The query parameters of the flavor lists; others are a 400 from 2.75.
KNOWN_QUERY = frozenset(
    {"is_public", "minRam", "minDisk", "limit", "marker", "sort_key", "sort_dir"}
)
#: From this microversion the lists filter by ``name`` and flavors have no
#: ``rxtx_factor`` (in bodies, on create) or ``OS-FLV-DISABLED:disabled``.
NO_RXTX_VERSION = "2.102"
#: What the lists may be sorted by (``rxtx_factor`` until 2.102).
SORT_KEYS = frozenset(
    {
        "created_at", "description", "disabled", "ephemeral_gb", "flavorid", "id",
        "is_public", "memory_mb", "name", "root_gb", "rxtx_factor", "swap", "updated_at",
        "vcpu_weight", "vcpus",
    }
)  # fmt: skip


async def flavor_query(
    request: Request,
    version: Version,
    *,
    is_public: Q = None,
    min_ram: Annotated[str | None, Query(alias="minRam")] = None,
    min_disk: Annotated[str | None, Query(alias="minDisk")] = None,
    limit: Q = None,
    marker: Q = None,
) -> FlavorQuery:
    named = version.at_least(NO_RXTX_VERSION)
    refuse_unknown(request.query_params, KNOWN_QUERY | {"name"} if named else KNOWN_QUERY, version)
    name = request.query_params.get("name") if named else None
    sort_key, descending = _sort(request.query_params, version)
    return FlavorQuery(is_public, min_ram, min_disk, limit, marker, name, sort_key, descending)


def _sort(params: QueryParams, version: APIVersion) -> tuple[str | None, bool]:
    """``sort_key``/``sort_dir`` as Nova reads them: each value checked, the last used."""
    valid = SORT_KEYS - {"rxtx_factor"} if version.at_least(NO_RXTX_VERSION) else SORT_KEYS
    for key in params.getlist("sort_key"):
        if key not in valid:
            raise BadRequest(
                f"Invalid input for query parameters sort_key. Value: {key}. '{key}' is not "
                f"one of {sorted(valid)}"
            )
    for direction in params.getlist("sort_dir"):
        if direction not in ("asc", "desc"):
            raise BadRequest(
                f"Invalid input for query parameters sort_dir. Value: {direction}. "
                f"'{direction}' is not one of ['asc', 'desc']"
            )
    return params.get("sort_key"), params.get("sort_dir") == "desc"


def _sorted(found: list[Flavor], key: str, descending: bool) -> list[Flavor]:
    """Sorted by ``key`` (``vcpu_weight``, which keel flavors do not have, keeps the order);
    unset values first, as they sort in Nova's database."""

    def value(flavor: Flavor) -> tuple[bool, Any]:
        found_value = getattr(flavor, key, None)
        return (found_value is not None, found_value)

    if key == "vcpu_weight":
        return found
    return sorted(found, key=value, reverse=descending)


Filters = Annotated[FlavorQuery, Depends(flavor_query)]


async def _list(
    pool: asyncpg.Pool, ctx: RequestContext, query: FlavorQuery, links: Links, path: str
) -> tuple[list[Flavor], dict[str, Any]]:
    """A page of flavors, and the extra body keys that link to the next page."""
    public = parse_is_public(query.is_public, is_admin=ctx.is_admin)
    least_ram = _minimum("minRam", query.min_ram)
    least_disk = _minimum("minDisk", query.min_disk)
    paging = page_request(query.limit, query.marker)
    async with pool.acquire() as conn:
        found = await flavors_db.list_flavors(conn, is_public=public, project_id=ctx.project_id)
    found = [f for f in found if f.memory_mb >= least_ram and f.root_gb >= least_disk]
    if query.name is not None:
        found = [f for f in found if _name_matches(query.name, f.name)]
    if query.sort_key is not None:
        found = _sorted(found, query.sort_key, query.descending)
    page = take_page(found, paging, key=lambda f: f.flavorid)
    after = next_marker(page, paging, key=lambda f: f.flavorid)
    if after is None:
        return page, {}
    params = {"marker": after, **({"limit": query.limit} if query.limit else {})}
    href = f"{links.compute(path)}?{urlencode(params)}"
    return page, {"flavors_links": [{"rel": "next", "href": href}]}


@router.get("")
async def list_flavors(
    pool: DbPool, ctx: Context, version: Version, links: RequestLinks, query: Filters
) -> dict[str, Any]:
    page, extra = await _list(pool, ctx, query, links, "flavors")
    return {"flavors": [flavor_summary(f, version, links) for f in page], **extra}


@router.get("/detail")
async def list_flavors_detail(
    pool: DbPool, ctx: Context, version: Version, links: RequestLinks, query: Filters
) -> dict[str, Any]:
    page, extra = await _list(pool, ctx, query, links, "flavors/detail")
    return {"flavors": [flavor_detail(f, version, links) for f in page], **extra}


@router.get("/{flavor_id}", dependencies=[NO_QUERY_FROM_2_102])
async def show_flavor(
    flavor_id: str, pool: DbPool, ctx: Context, version: Version, links: RequestLinks
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        flavor = await visible_flavor(conn, ctx, flavor_id)
    return {"flavor": flavor_detail(flavor, version, links)}


class NewFlavor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=255)
    #: A string, or a JSON number as Nova takes it (kept as its decimal text).
    id: str | None = None
    ram: PositiveInt4
    vcpus: PositiveInt4
    disk: Int4
    ephemeral: Int4 = Field(default=0, alias="OS-FLV-EXT-DATA:ephemeral")
    swap: Int4 = 0
    rxtx_factor: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    is_public: bool = Field(default=True, alias="os-flavor-access:is_public")
    description: str | None = Field(default=None, max_length=65535)

    @field_validator("name")
    @classmethod
    def _no_surrounding_spaces(cls, value: str) -> str:
        if value != value.strip():
            raise ValueError("must not start or end with whitespace")
        return value

    @field_validator("id", mode="before")
    @classmethod
    def _flavor_id(cls, value: object) -> object:
        """Nova's rule: 1-255 letters, digits, ``.``, ``_``, ``-`` and inner spaces."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and not _FLAVOR_ID.fullmatch(value):
            raise ValueError(
                "must be 1-255 letters, digits, '.', '_', '-' or spaces, "
                "not starting or ending with a space"
            )
        return value


class NewFlavorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flavor: NewFlavor


@router.post("", status_code=200)
async def create_flavor(
    body: NewFlavorBody, pool: DbPool, ctx: AdminContext, version: Version, links: RequestLinks
) -> dict[str, Any]:
    new = body.flavor
    if new.description is not None and not version.at_least("2.55"):
        raise BadRequest("Flavor descriptions need microversion 2.55 or later.")
    if "rxtx_factor" in new.model_fields_set and version.at_least(NO_RXTX_VERSION):
        raise BadRequest(
            "Invalid input for field/attribute flavor. Additional properties are not allowed "
            f"('rxtx_factor' was unexpected): it was removed in microversion {NO_RXTX_VERSION}."
        )
    async with pool.acquire() as conn:
        flavor = await flavors_db.create(
            conn,
            flavorid=new.id or str(uuid.uuid4()),
            name=new.name,
            vcpus=new.vcpus,
            memory_mb=new.ram,
            root_gb=new.disk,
            ephemeral_gb=new.ephemeral,
            swap=new.swap,
            rxtx_factor=new.rxtx_factor,
            is_public=new.is_public,
            description=new.description,
        )
    return {"flavor": flavor_detail(flavor, version, links)}


class FlavorChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str | None = Field(max_length=65535)


class FlavorChangeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flavor: FlavorChange


@router.put("/{flavor_id}")
async def update_flavor(
    flavor_id: str,
    body: FlavorChangeBody,
    *,
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
    links: RequestLinks,
) -> dict[str, Any]:
    """Change a flavor's description (2.55): the only thing about a flavor that changes."""
    if not version.at_least("2.55"):
        raise ItemNotFound("Updating a flavor needs microversion 2.55 or later.")
    async with pool.acquire() as conn:
        flavor = await flavors_db.set_description(conn, flavor_id, body.flavor.description)
    LOG.info("flavor %s: description changed", flavor_id)
    return {"flavor": flavor_detail(flavor, version, links)}


@router.delete("/{flavor_id}", status_code=202, response_class=Response)
async def delete_flavor(flavor_id: str, pool: DbPool, ctx: AdminContext) -> Response:
    async with pool.acquire() as conn:
        await flavors_db.delete(conn, flavor_id)
    return Response(status_code=202)
