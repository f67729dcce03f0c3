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
from fastapi import FastAPI

from services.api import identity, ops
from services.api.http import faults, openapi
from services.api.http.input_guard import InputGuard
from services.api.http.middleware import ApiMiddleware
from services.api.http.policy import Policy
from services.api.keystone.tokens import KeystoneTokens
from services.api.network import routes as network_routes
from services.api.ops.headers import OpsHeaders
from services.api.resources import (
    aggregates,
    availability_zones,
    flavor_access,
    flavor_extra_specs,
    flavors,
    host_tasks,
    hypervisors,
    image_data,
    image_proxy,
    image_schemas,
    images,
    keypairs,
    limits,
    os_migrations,
    os_services,
    quota_sets,
    server_groups,
    usage,
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
    app.include_router(openapi.router)
    app.include_router(versions.router)
    app.include_router(servers.router)
    app.include_router(server_actions.router)
    app.include_router(instance_actions.router)
    app.include_router(os_migrations.router)
    app.include_router(server_update.router)
    app.include_router(server_metadata.router)
    app.include_router(server_tags.router)
    app.include_router(server_ips.router)
    app.include_router(server_security_groups.router)
    app.include_router(server_password.router)
    app.include_router(server_diagnostics.router)
    app.include_router(server_topology.router)
    app.include_router(flavors.router)
    app.include_router(flavor_extra_specs.router)
    app.include_router(flavor_access.router)
    app.include_router(os_services.router)
    app.include_router(hypervisors.router)
    app.include_router(host_tasks.router)
    app.include_router(aggregates.router)
    app.include_router(availability_zones.router)
    app.include_router(keypairs.router)
    app.include_router(quota_sets.router)
    app.include_router(server_groups.router)
    app.include_router(limits.router)
    app.include_router(usage.router)
    app.include_router(image_proxy.router)
    app.include_router(images.router, prefix="/image/v2")
    app.include_router(image_data.router, prefix="/image/v2")
    app.include_router(image_schemas.router, prefix="/image/v2")
    app.include_router(image_data.download_router)
    if keystone is None:
        app.include_router(identity.router())
    app.include_router(network_routes.router)
    app.include_router(ops.router())
    return app
