"""schemathesis hooks for fuzzing keel-api (``SCHEMATHESIS_HOOKS=tests.e2e.fuzz_hooks``).

* ``nova_fault_body``: a check that every error answer (but to HEAD, which has no
  body) is a Nova-shaped fault, a JSON object with one key whose value carries the
  status ``code`` and a ``message`` (under ``/network``, Neutron's error shape);
* ``existing_image_and_flavor``: new servers name the ``cirros`` image and flavor ``1``
  when the generated references are strings, so the fuzzer gets past "image not
  found" into the rest of the create path (references of other types stay, so type
  errors are still tried);
* the Image API's JSON-patch media types (an image ``PATCH``) are sent as JSON is.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

from services.api.resources.image_patch import PATCH_TYPES
from tests.e2e.cloud import CIRROS_ID

schemathesis.serializer.alias(list(PATCH_TYPES), "application/json")


def fault_problem(status: int, text: str, *, neutron: bool = False) -> str | None:
    """Why ``text`` is not the fault for ``status``; ``None`` if it is. ``neutron``: an
    answer of the Networking API, whose errors have Neutron's shape instead."""
    try:
        body = json.loads(text)
    except ValueError:
        return f"the {status} answer is not JSON: {text[:200]!r}"
    if neutron and isinstance(body, dict) and set(body) == {"NeutronError"}:
        error = body["NeutronError"]
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return None
        return f"the {status} answer's NeutronError has no message: {text[:200]!r}"
    if not (isinstance(body, dict) and len(body) == 1):
        return f"the {status} answer is not a fault: {text[:200]!r}"
    (fault,) = body.values()
    if not isinstance(fault, dict) or fault.get("code") != status:
        return f"the {status} answer's fault has no code {status}: {text[:200]!r}"
    if not isinstance(fault.get("message"), str):
        return f"the {status} answer's fault has no message: {text[:200]!r}"
    return None


@schemathesis.check
def nova_fault_body(ctx: Any, response: Any, case: Any) -> bool | None:
    # An answer to HEAD has no body by definition, error or not.
    if response.status_code < 400 or case.method.upper() == "HEAD":
        return None
    neutron = case.path.startswith("/network")
    problem = fault_problem(response.status_code, response.text, neutron=neutron)
    if problem is not None:
        raise AssertionError(problem)
    return None


# schemathesis types hook() as returning a bare Callable, without its apply_to.
@schemathesis.hook("map_body").apply_to(  # type: ignore[attr-defined, untyped-decorator]
    method="POST", path="/v2.1/servers"
)
def existing_image_and_flavor(ctx: Any, body: Any) -> Any:
    server = body.get("server") if isinstance(body, dict) else None
    if isinstance(server, dict):
        if isinstance(server.get("imageRef"), str):
            server["imageRef"] = str(CIRROS_ID)
        if isinstance(server.get("flavorRef"), str):
            server["flavorRef"] = "1"
    return body
