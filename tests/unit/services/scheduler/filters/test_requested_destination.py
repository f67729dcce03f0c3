from __future__ import annotations

from services.scheduler.filters.requested_destination import RequestedDestinationFilter
from services.scheduler.host_manager import HostManager
from shared.db.host_candidates import HostSql
from shared.objects.instance import RequestedDestination
from tests.unit.services.scheduler.hosts import make_host, make_spec


def test_only_the_requested_nodes_pass() -> None:
    wanted, other = make_host("b"), make_host("a")
    spec = make_spec().model_copy(
        update={"requested_destination": RequestedDestination(host="b", node_ids=[wanted.node.id])}
    )
    assert RequestedDestinationFilter().host_passes(wanted, spec)
    assert not RequestedDestinationFilter().host_passes(other, spec)


def test_without_a_destination_every_node_passes_and_there_is_no_sql() -> None:
    spec = make_spec()
    assert RequestedDestinationFilter().host_passes(make_host("a"), spec)
    assert RequestedDestinationFilter().sql_condition(spec, HostSql(60)) is None


def test_the_sql_form_binds_the_node_ids() -> None:
    sql = HostSql(60)
    spec = make_spec().model_copy(
        update={"requested_destination": RequestedDestination(node="n", node_ids=[4, 9])}
    )
    assert RequestedDestinationFilter().sql_condition(spec, sql) == "n.id = ANY($2::bigint[])"
    assert sql.args == [60, [4, 9]]


def test_a_requested_host_still_goes_through_every_filter() -> None:
    disabled = make_host("b", disabled=True)
    destination = RequestedDestination(host="b", node_ids=[disabled.node.id])
    spec = make_spec().model_copy(update={"requested_destination": destination})
    passed, results = HostManager(service_down_time=60).apply_filters([disabled], spec)
    assert passed == []
    assert [r.name for r in results][:2] == ["RequestedDestinationFilter", "ComputeFilter"]


def test_a_forced_host_skips_every_other_filter_but_the_server_groups() -> None:
    disabled = make_host("b", disabled=True, memory_mb=256)
    other = make_host("a")
    destination = RequestedDestination(host="b", node_ids=[disabled.node.id], forced=True)
    spec = make_spec().model_copy(update={"requested_destination": destination})
    passed, results = HostManager(service_down_time=60).apply_filters([other, disabled], spec)
    assert passed == [disabled]
    assert [r.name for r in results] == ["RequestedDestinationFilter", "ServerGroupFilter"]


def test_a_custom_filter_list_without_it_still_narrows() -> None:
    wanted, other = make_host("b"), make_host("a")
    destination = RequestedDestination(host="b", node_ids=[wanted.node.id])
    spec = make_spec().model_copy(update={"requested_destination": destination})
    manager = HostManager(service_down_time=60, filters=[])
    assert manager.apply_filters([other, wanted], spec)[0] == [wanted]
