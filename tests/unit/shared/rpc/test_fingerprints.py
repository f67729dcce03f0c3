"""No RPC message changes without a version bump and a history line."""

from __future__ import annotations

import pytest

from tests.unit.shared.rpc.fingerprints import ENDPOINTS, current, stored

UPDATE = ".venv/bin/python -m tests.unit.shared.rpc.fingerprints --update"


@pytest.mark.parametrize("api", sorted(ENDPOINTS))
def test_messages_match_the_recorded_schemas_of_their_version(api: str) -> None:
    now, recorded = current()[api], stored()[api]
    changed = sorted(
        method
        for method in set(now["methods"]) | set(recorded["methods"])
        if now["methods"].get(method) != recorded["methods"].get(method)
    )
    if now["version"] == recorded["version"]:
        assert changed == [], (
            f"the {api} RPC messages of {', '.join(changed)} changed, but the {api} RPC "
            f"version is still {now['version']}: bump it in services/{api}/rpcapi.py with a "
            f"history line, add a release to shared/versions.py, step the new arguments "
            f"down for older receivers, then run `{UPDATE}`"
        )
    else:
        pytest.fail(
            f"the {api} RPC version is now {now['version']} (recorded: "
            f"{recorded['version']}): record its schemas with `{UPDATE}`"
        )


@pytest.mark.parametrize("api", sorted(ENDPOINTS))
def test_each_version_has_a_history_line(api: str) -> None:
    version = current()[api]["version"]
    rpcapi = __import__(f"services.{api}.rpcapi", fromlist=["__doc__"])
    assert f"* {version} —" in (rpcapi.__doc__ or ""), (
        f"services/{api}/rpcapi.py does not say what {api} RPC {version} changed"
    )
