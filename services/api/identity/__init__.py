"""A minimal Identity API v3 under ``/identity``: password tokens with a service catalog.

Enough for the stock client and SDK to authenticate with a plain ``auth_type:
password`` cloud and find the compute and image endpoints in the token's catalog, and
to resolve project and user names. Users, projects and roles are managed with
``keel-manage``; there are no write routes here other than issuing and revoking tokens.
"""

from __future__ import annotations

from fastapi import APIRouter

from services.api.identity import directory, discovery, tokens


def router() -> APIRouter:
    """Every identity route, under ``/identity``."""
    combined = APIRouter()
    combined.include_router(discovery.router)
    combined.include_router(tokens.router)
    combined.include_router(directory.router)
    return combined
