"""The operator's page at ``/ops/``: the fleet at a glance, for admins, read-mostly.

:mod:`~services.api.ops.pages` serves the page and its login, :mod:`.session` decides who
is an operator, :mod:`.data` answers the JSON the page polls and :mod:`.actions` the
changes it asks for, through the same code as the compute API's own routes.
"""

from __future__ import annotations

from fastapi import APIRouter

from services.api.ops import actions, data, pages


def router() -> APIRouter:
    """Every route of the operator's page."""
    combined = APIRouter()
    combined.include_router(pages.router)
    combined.include_router(data.router)
    combined.include_router(actions.router)
    return combined
