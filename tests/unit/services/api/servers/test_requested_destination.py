from __future__ import annotations

import pytest

from services.api.http.faults import BadRequest
from services.api.servers.requested_destination import ZoneRequest, parse_zone
from services.conductor.rpcapi import BuildInstances
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestedDestination, RequestSpec


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (None, ZoneRequest(zone=None)),
        ("nova", ZoneRequest(zone="nova")),
        ("nova:b", ZoneRequest(zone="nova", host="b")),
        ("nova:b:n", ZoneRequest(zone="nova", host="b", node="n")),
        ("nova::n", ZoneRequest(zone="nova", node="n")),
        (":b", ZoneRequest(zone=None, host="b")),
        ("nova:", ZoneRequest(zone="nova")),
    ],
)
def test_zone_forms(value: str | None, parsed: ZoneRequest) -> None:
    assert parse_zone(value) == parsed
    assert parse_zone(value).forced == (parsed.host is not None or parsed.node is not None)


def test_more_than_three_parts_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="Invalid availability_zone"):
        parse_zone("a:b:c:d")


def test_a_destination_needs_a_node() -> None:
    with pytest.raises(ValueError, match="node_ids"):
        RequestedDestination(host="b", node_ids=[])


def test_describe() -> None:
    assert RequestedDestination(host="b", node_ids=[1]).describe() == "host b"
    assert (
        RequestedDestination(host="b", node="n", node_ids=[1], forced=True).describe()
        == "host b and node n (forced)"
    )


def test_messages_without_a_destination_read_as_older_releases_wrote_them() -> None:
    build = BuildInstances.model_validate({"instance_uuid": "0" * 32})
    assert "requested_destination" not in build.model_dump(mode="json")
    spec = RequestSpec.model_validate(
        {
            "instance_uuid": "0" * 32,
            "project_id": "p",
            "user_id": "u",
            "flavor": FlavorSnapshot(flavorid="1", name="f", vcpus=1, memory_mb=1, root_gb=1),
        }
    )
    assert "requested_destination" not in spec.model_dump(mode="json")
    carried = BuildInstances(
        instance_uuid=spec.instance_uuid,
        requested_destination=RequestedDestination(host="b", node_ids=[3]),
    )
    assert carried.model_dump(mode="json")["requested_destination"]["node_ids"] == [3]
