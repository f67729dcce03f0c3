"""The environment of a cloud's processes: the ``KEEL_*`` settings they all share.

:func:`keel_env` starts from this process's environment without any ``KEEL_*`` or
``OS_*`` variable (so a developer's own settings never leak into a test cloud) and sets
the ones every harness needs; ``extra`` adds or overrides any other. One setting is
passed on: ``KEEL_EVENT_LOOP``, so that a tier can be run with the cloud's processes on
either event loop (``KEEL_EVENT_LOOP=uvloop make test-ha``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from devkit import ROOT

#: ``KEEL_*`` settings a harness's clouds take from its own environment.
PASSED_ON = ("KEEL_EVENT_LOOP",)


def clean_environ() -> dict[str, str]:
    """This process's environment without ``KEEL_*`` and ``OS_*`` variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "OS_"))}


def with_devkit(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the checkout on ``PYTHONPATH``, for a script that imports devkit."""
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def keel_env(
    *,
    database_url: str,
    transport_url: str,
    exchange: str,
    api_bind: str,
    tokens: Mapping[str, Mapping[str, object]] | None = None,
    host: str = "controller",
    report_interval: float = 1,
    service_down_time: float = 10,
    queue_expires: float = 60,
    connect_timeout: float = 20,
    log_level: str = "INFO",
    vcpus: int | None = None,
    memory_mb: int | None = None,
    local_gb: int | None = None,
    drain_timeout: float = 10,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What a harness's keel processes start with.

    Allocation ratios are 1 so capacity is exactly what ``vcpus``, ``memory_mb`` and
    ``local_gb`` say (unset: measured by each agent). Logs are text. The event loop is
    this process's ``KEEL_EVENT_LOOP``, if it says.
    """
    env = clean_environ()
    env.update({name: os.environ[name] for name in PASSED_ON if os.environ.get(name)})
    env.update(
        KEEL_DATABASE_URL=database_url,
        KEEL_TRANSPORT_URL=transport_url,
        KEEL_EXCHANGE=exchange,
        KEEL_API_BIND=api_bind,
        KEEL_HOST=host,
        KEEL_RPC__QUEUE_EXPIRES=f"{queue_expires:g}",
        KEEL_RPC__CONNECT_TIMEOUT=f"{connect_timeout:g}",
        KEEL_DATABASE__CONNECT_TIMEOUT=f"{connect_timeout:g}",
        KEEL_REPORT_INTERVAL=f"{report_interval:g}",
        KEEL_SERVICE_DOWN_TIME=f"{service_down_time:g}",
        KEEL_LOG_FORMAT="text",
        KEEL_LOG_LEVEL=log_level,
        KEEL_COMPUTE__CPU_ALLOCATION_RATIO="1",
        KEEL_COMPUTE__RAM_ALLOCATION_RATIO="1",
        KEEL_COMPUTE__DISK_ALLOCATION_RATIO="1",
        KEEL_COMPUTE__DRAIN_TIMEOUT=f"{drain_timeout:g}",
    )
    if tokens is not None:
        env["KEEL_AUTH__TOKENS"] = json.dumps(tokens)
    for name, value in (("VCPUS", vcpus), ("MEMORY_MB", memory_mb), ("LOCAL_GB", local_gb)):
        if value is not None:
            env[f"KEEL_COMPUTE__{name}"] = str(value)
    env.update(extra or {})
    return env
