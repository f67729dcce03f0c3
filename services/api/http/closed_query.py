"""Routes that take no query parameter: any is a 400 from microversion 2.102.

Nova ignored unknown query parameters on most of its routes until 2.102, then refused
them everywhere (the server, flavor, key pair... lists already from 2.75, see
:func:`services.api.http.query.refuse_unknown`). A route that takes none names
:data:`NO_QUERY_FROM_2_102` among its dependencies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from fastapi.params import Depends as DependsParam

from services.api.http.deps import Version
from services.api.http.query import refuse_unknown

#: The microversion from which every route refuses what it does not know.
CLOSED_VERSION = "2.102"


def closed_query(*known: str, since: str = CLOSED_VERSION) -> DependsParam:
    """A route dependency: from ``since`` on, a query parameter not in ``known`` is a 400."""

    async def check(request: Request, version: Version) -> None:
        refuse_unknown(request.query_params, known, version, since=since)

    checker: Callable[[Request, Version], Awaitable[None]] = check
    dependency: DependsParam = Depends(checker)
    return dependency


NO_QUERY_FROM_2_102 = closed_query()
