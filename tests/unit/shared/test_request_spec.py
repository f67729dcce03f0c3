"""Request specs travel and are stored so that releases without ``ignore_nodes`` read them."""

from __future__ import annotations

import uuid

from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec

SPEC = RequestSpec(
    instance_uuid=uuid.uuid4(),
    project_id="p",
    user_id="u",
    flavor=FlavorSnapshot(flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1),
)


def test_an_empty_ignore_nodes_is_left_out() -> None:
    assert "ignore_nodes" not in SPEC.model_dump(mode="json")
    assert RequestSpec.model_validate_json(SPEC.model_dump_json()) == SPEC


def test_ignored_nodes_travel_by_uuid() -> None:
    spec = SPEC.model_copy(update={"ignore_nodes": [uuid.uuid4()]})
    assert RequestSpec.model_validate_json(spec.model_dump_json()) == spec
