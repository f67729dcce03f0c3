"""What routes receive from the application: settings, pool, RPC clients, microversion.

``create_app`` puts these objects on ``app.state``; routes name them as typed
parameters (``pool: DbPool``), never as globals.
"""

from __future__ import annotations

from typing import Annotated

import asyncpg
from fastapi import Depends, Request

from services.api.http.links import Links
from services.api.http.microversion import MIN_VERSION, APIVersion
from services.api.http.policy import Policy
from services.api.keystone.tokens import KeystoneTokens
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.rpc.client import CapSource


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_pool(request: Request) -> asyncpg.Pool:
    pool: asyncpg.Pool = request.app.state.pool
    return pool


async def get_conductor(request: Request) -> ConductorAPI:
    conductor: ConductorAPI = request.app.state.conductor
    return conductor


async def get_compute(request: Request) -> ComputeAPI:
    compute: ComputeAPI = request.app.state.compute
    return compute


async def get_version(request: Request) -> APIVersion:
    """The microversion negotiated for this request (the minimum outside ``/v2.1``)."""
    version: APIVersion = getattr(request.state, "api_version", MIN_VERSION)
    return version


async def get_policy(request: Request) -> Policy:
    policy: Policy = request.app.state.policy
    return policy


async def get_keystone(request: Request) -> KeystoneTokens | None:
    """Keystone's token validation, when keel-api runs behind Keystone."""
    keystone: KeystoneTokens | None = request.app.state.keystone
    return keystone


async def get_scheduler_cap(request: Request) -> str:
    """The scheduler RPC version every scheduler speaks now."""
    cap: str | CapSource = request.app.state.scheduler_cap
    return cap if isinstance(cap, str) else await cap()


async def get_links(request: Request) -> Links:
    return Links(str(request.base_url))


AppSettings = Annotated[Settings, Depends(get_settings)]
DbPool = Annotated[asyncpg.Pool, Depends(get_pool)]
Conductor = Annotated[ConductorAPI, Depends(get_conductor)]
Compute = Annotated[ComputeAPI, Depends(get_compute)]
Version = Annotated[APIVersion, Depends(get_version)]
RequestLinks = Annotated[Links, Depends(get_links)]
AppPolicy = Annotated[Policy, Depends(get_policy)]
Keystone = Annotated[KeystoneTokens | None, Depends(get_keystone)]
SchedulerCap = Annotated[str, Depends(get_scheduler_cap)]
