"""Schema fingerprints of every RPC API, to catch a message change without a version bump.

For each API (compute, conductor, scheduler) the fingerprint of a method is a hash of the
JSON schemas of its request and result models, read from the endpoint's signatures as
the RPC server reads them. ``fingerprints.json`` keeps them with the API version they
belong to. Regenerate it after bumping a version (and adding its history lines)::

    .venv/bin/python -m tests.unit.shared.rpc.fingerprints --update
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from services.compute.manager import ComputeManager
from services.conductor.manager import ConductorManager
from services.scheduler.manager import SchedulerManager
from shared.versions import SERVICE_VERSION, RpcApi, apis_for

STORED = Path(__file__).with_name("fingerprints.json")
ENDPOINTS: dict[RpcApi, type] = {
    "compute": ComputeManager,
    "conductor": ConductorManager,
    "scheduler": SchedulerManager,
}


def _schema(model: Any) -> Any:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model.model_json_schema()
    return repr(model)


def method_fingerprints(endpoint: type) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, func in inspect.getmembers(endpoint, inspect.iscoroutinefunction):
        if name.startswith("_"):
            continue
        hints = typing.get_type_hints(func)
        params = list(inspect.signature(func).parameters)[1:]  # without self
        request = hints.get(params[1]) if len(params) == 2 else None
        shape = {"request": _schema(request), "result": _schema(hints.get("return"))}
        text = json.dumps(shape, sort_keys=True)
        found[name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return found


def current() -> dict[str, dict[str, Any]]:
    apis = apis_for(SERVICE_VERSION)
    return {
        api: {"version": apis.version_of(api), "methods": method_fingerprints(endpoint)}
        for api, endpoint in ENDPOINTS.items()
    }


def stored() -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = json.loads(STORED.read_text())
    return loaded


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        print(__doc__)
        sys.exit(2)
    STORED.write_text(json.dumps(current(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {STORED}")
