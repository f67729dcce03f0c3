from __future__ import annotations

from services.scheduler.filters.ignore_hosts import IgnoreHostsFilter
from tests.unit.services.scheduler.hosts import make_host, make_spec


def test_ignored_node_is_rejected_by_uuid_whatever_its_host_is_called() -> None:
    host = make_host("host1")
    renamed = host.model_copy(
        update={
            "node": host.node.model_copy(update={"host": "renamed"}),
            "service": host.service.model_copy(update={"host": "renamed"}),
        }
    )
    spec = make_spec(ignore_nodes=[host.node.uuid])
    assert not IgnoreHostsFilter().host_passes(host, spec)
    assert not IgnoreHostsFilter().host_passes(renamed, spec)


def test_other_nodes_pass() -> None:
    spec = make_spec(ignore_nodes=[make_host("host1").node.uuid])
    assert IgnoreHostsFilter().host_passes(make_host("host2"), spec)
    assert IgnoreHostsFilter().host_passes(make_host("host1"), make_spec())


def test_host_names_of_older_request_specs_are_still_honoured() -> None:
    spec = make_spec(ignore_hosts=["host1"])
    assert not IgnoreHostsFilter().host_passes(make_host("host1"), spec)
    assert IgnoreHostsFilter().host_passes(make_host("host2"), spec)
