"""The keel-api application: routes, error handling and the objects routes depend on.

:func:`create_app` builds a FastAPI application around objects made elsewhere (in
``main.py`` for a real process, in fixtures for tests): the settings, the database pool
and the RPC clients. Routes reach them through ``app.state`` (see ``deps.py``). Every request passes
:class:`~services.api.http.middleware.ApiMiddleware` (request id, microversion, last-resort
errors) and then :class:`~services.api.http.input_guard.InputGuard` (body size, text and
numbers PostgreSQL cannot store) before a route sees it.
"""

from __future__ import annotations

import asyncpg
from fastapi import APIRouter, FastAPI

from services.api import identity, ops
from services.api.http import faults, openapi
from services.api.http.input_guard import InputGuard
from services.api.http.middleware import ApiMiddleware
from services.api.http.policy import Policy
from services.api.identity.verified import VerifiedPasswords
from services.api.keystone.tokens import KeystoneTokens
from services.api.network import groups as network_groups
from services.api.network import managed as network_managed
from services.api.network import routes as network_routes
from services.api.ops.headers import OpsHeaders
from services.api.resources import (
    aggregates,
    availability_zones,
    external_events,
    flavor_access,
    flavor_extra_specs,
    flavors,
    host_tasks,
    hypervisors,
    image_data,
    image_metadata,
    image_proxy,
    image_schemas,
    images,
    keypairs,
    limits,
    os_migrations,
    os_services,
    quota_classes,
    quota_sets,
    server_groups,
    usage,
    usage_audit_log,
    versions,
)
from services.api.servers import actions as server_actions
from services.api.servers import diagnostics as server_diagnostics
from services.api.servers import instance_actions
from services.api.servers import ips as server_ips
from services.api.servers import metadata as server_metadata
from services.api.servers import password as server_password
from services.api.servers import routes as servers
from services.api.servers import security_groups as server_security_groups
from services.api.servers import tags as server_tags
from services.api.servers import topology as server_topology
from services.api.servers import update as server_update
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from services.scheduler.rpcapi import RPC_VERSION as SCHEDULER_RPC_VERSION
from shared.config import Settings
from shared.rpc.client import CapSource
from shared.version_pins import Pins

#: The routers every keel-api serves, in order, each with its path prefix (identity and
#: the operator's page are added after them).
_ROUTERS: tuple[tuple[APIRouter, str], ...] = (
    (openapi.router, ""),
    (versions.router, ""),
    (servers.router, ""),
    (server_actions.router, ""),
    (instance_actions.router, ""),
    (os_migrations.router, ""),
    (server_update.router, ""),
    (server_metadata.router, ""),
    (server_tags.router, ""),
    (server_ips.router, ""),
    (server_security_groups.router, ""),
    (server_password.router, ""),
    (server_diagnostics.router, ""),
    (server_topology.router, ""),
    (external_events.router, ""),
    (flavors.router, ""),
    (flavor_extra_specs.router, ""),
    (flavor_access.router, ""),
    (os_services.router, ""),
    (hypervisors.router, ""),
    (host_tasks.router, ""),
    (aggregates.router, ""),
    (availability_zones.router, ""),
    (keypairs.router, ""),
    (quota_sets.router, ""),
    (quota_classes.router, ""),
    (server_groups.router, ""),
    (limits.router, ""),
    (usage.router, ""),
    (usage_audit_log.router, ""),
    (image_metadata.router, ""),
    (image_proxy.router, ""),
    (images.router, "/image/v2"),
    (image_data.router, "/image/v2"),
    (image_schemas.router, "/image/v2"),
    (image_data.download_router, ""),
)


def create_app(
    settings: Settings,
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    policy: Policy | None = None,
    keystone: KeystoneTokens | None = None,
    pins: Pins | None = None,
    scheduler_cap: str | CapSource = SCHEDULER_RPC_VERSION,
) -> FastAPI:
    """The application; with ``keystone`` it validates tokens against Keystone and serves
    no identity of its own (no ``/identity`` routes)."""
    app = FastAPI(
        title="keel-api",
        summary="OpenStack Compute API v2.1 subset and an image metadata registry",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by services.api.http.openapi, to whom the settings allow
    )
    app.state.settings = settings
    app.state.pool = pool
    app.state.conductor = conductor
    app.state.compute = compute
    app.state.policy = policy or Policy.load(settings.api.policy_file)
    app.state.keystone = keystone
    #: Passwords verified lately, so a repeated login skips scrypt.
    app.state.verified_passwords = VerifiedPasswords()
    #: keel-api's RPC pins, shown on the operator's page (made there when not given).
    app.state.pins = pins
    #: What the schedulers speak (the automatic pin in a real process): a server joins a
    #: group only once every scheduler honours groups.
    app.state.scheduler_cap = scheduler_cap
    faults.install(app)
    # The last added runs first: the operator's page's headers, request id and
    # microversion, then the input guard.
    app.add_middleware(InputGuard, max_body_bytes=settings.api.max_body_bytes)
    app.add_middleware(ApiMiddleware)
    app.add_middleware(OpsHeaders)
    for router, prefix in _ROUTERS:
        app.include_router(router, prefix=prefix)
    if keystone is None:
        app.include_router(identity.router())
    app.include_router(network_routes.router)
    app.include_router(network_managed.router)
    app.include_router(network_groups.router)
    app.include_router(ops.router())
    return app
