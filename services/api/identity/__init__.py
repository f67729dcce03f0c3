"""The embedded Identity API v3 under ``/identity``: tokens, and its admin API.

Password tokens with a service catalog, so the stock client and SDK authenticate with a
plain ``auth_type: password`` cloud and find the compute, image and network endpoints;
and the admin API Keystone's v3 reference describes for the objects keel keeps — the
one domain, projects, users, roles and role assignments — so Tempest's dynamic
credentials, Rally's ``users`` context and ``openstack project|user|role`` work
unchanged. ``keel-manage project|user`` change the same objects through the same
queries (:mod:`shared.db`).
"""

from __future__ import annotations

from fastapi import APIRouter

from services.api.identity import (
    discovery,
    domains,
    grants,
    projects,
    roles,
    scopes,
    tokens,
    users,
)


def router() -> APIRouter:
    """Every identity route, under ``/identity``."""
    combined = APIRouter()
    for module in (discovery, tokens, scopes, domains, projects, users, roles, grants):
        combined.include_router(module.router)
    return combined
