"""Reading the server list's query string: what is kept, ignored, or refused."""

from __future__ import annotations

import pytest
from starlette.datastructures import QueryParams

from services.api.http.faults import Fault
from services.api.http.microversion import APIVersion
from services.api.servers.filters import server_search, sort_order
from shared.context import RequestContext

ADMIN = RequestContext(user_id="root", project_id="ops", roles=("admin",))
MEMBER = RequestContext(user_id="alice", project_id="team", roles=("member",))
LATEST = APIVersion(2, 74)


def order(query: str, ctx: RequestContext = ADMIN) -> list[tuple[str, str]]:
    return [(k, str(d)) for k, d in sort_order(QueryParams(query), ctx, LATEST)]


def refused(query: str, ctx: RequestContext = ADMIN, version: APIVersion = LATEST) -> int:
    with pytest.raises(Fault) as caught:
        server_search(QueryParams(query), ctx, version)
    return caught.value.code


def test_default_order_is_newest_first() -> None:
    assert order("") == [("created_at", "desc")]


def test_directions_pair_with_keys_and_fill_from_the_first() -> None:
    assert order("sort_key=display_name&sort_key=host&sort_dir=asc") == [
        ("display_name", "asc"),
        ("host", "asc"),
        ("created_at", "asc"),
    ]
    assert order("sort_key=display_name&sort_dir=asc&sort_key=created_at&sort_dir=desc") == [
        ("display_name", "asc"),
        ("created_at", "desc"),
    ]


def test_ignored_keys_drop_with_their_direction() -> None:
    assert order("sort_key=id&sort_dir=asc&sort_key=display_name&sort_dir=desc") == [
        ("display_name", "desc"),
        ("created_at", "desc"),
    ]


def test_bad_sort_parameters_are_refused() -> None:
    assert refused("sort_key=bogus") == 400
    assert refused("sort_key=display_name&sort_dir=sideways") == 400
    assert refused("sort_key=display_name&sort_dir=asc&sort_dir=desc") == 400
    assert refused("sort_key=node", MEMBER) == 403


def test_locked_is_a_sort_key_from_2_73_and_ignored_before() -> None:
    assert order("sort_key=locked") == [("locked", "desc"), ("created_at", "desc")]
    before = sort_order(QueryParams("sort_key=locked"), ADMIN, APIVersion(2, 72))
    assert before == [("created_at", "desc")]


def test_members_lose_admin_filters_silently_as_in_nova() -> None:
    search, _ = server_search(QueryParams("host=h&user_id=u&deleted=true&name=web"), MEMBER, LATEST)
    assert search.project_id == "team"
    assert search.exact == {}
    assert search.regex == {"display_name": "web"}
    assert search.deleted is False


def test_admins_list_their_project_unless_all_tenants() -> None:
    own, _ = server_search(QueryParams("project_id=other"), ADMIN, LATEST)
    assert own.project_id == "ops"
    other, _ = server_search(QueryParams("all_tenants=1&project_id=other"), ADMIN, LATEST)
    assert other.project_id == "other"
    everyone, _ = server_search(QueryParams("all_tenants"), ADMIN, LATEST)
    assert everyone.project_id is None


def test_changes_since_includes_deleted_servers_unless_told_otherwise() -> None:
    since, _ = server_search(QueryParams("changes-since=2024-01-01T00:00:00Z"), ADMIN, LATEST)
    assert since.deleted is None
    assert since.changes_since is not None
    assert since.changes_since.tzinfo is not None
    live, _ = server_search(QueryParams("changes-since=2024-01-01&deleted=false"), ADMIN, LATEST)
    assert live.deleted is False


def test_values_that_cannot_be_read_are_refused() -> None:
    assert refused("changes-since=soon") == 400
    assert refused("changes-before=soon") == 400
    assert refused("locked=perhaps") == 400
    assert refused("status=sleeping") == 400
    assert refused("metadata=x") == 400
    assert refused("_hidden=x") == 400
    assert refused("limit=ten") == 400
    assert refused("status=DELETED", MEMBER) == 403


def test_unknown_status_before_2_38_matches_nothing() -> None:
    search, _ = server_search(QueryParams("status=sleeping"), ADMIN, APIVersion(2, 37))
    assert search.nothing


def test_unknown_names_and_once_ignored_sort_keys_are_refused_from_2_75() -> None:
    before, at_2_75 = APIVersion(2, 74), APIVersion(2, 75)
    server_search(QueryParams("bogus=1&sort_key=vcpus"), MEMBER, before)
    assert refused("bogus=1", MEMBER, at_2_75) == 400
    assert refused("sort_key=vcpus", ADMIN, at_2_75) == 400
    # Names Nova's schema knows pass, members' admin-only filters are still ignored.
    server_search(QueryParams("host=h1&soft_deleted=true&_secret=1"), MEMBER, at_2_75)
    assert refused("_secret=1", ADMIN, at_2_75) == 400


def test_members_may_use_more_filters_from_2_83_and_hostname_from_2_90() -> None:
    below, _ = server_search(QueryParams("vm_state=active&hostname=^db"), MEMBER, APIVersion(2, 82))
    assert "vm_state" not in below.exact
    opened, _ = server_search(
        QueryParams("vm_state=active&hostname=^db"), MEMBER, APIVersion(2, 83)
    )
    assert opened.exact["vm_state"] == ["active"]
    assert "hostname" not in opened.regex
    named, _ = server_search(QueryParams("hostname=^db"), MEMBER, APIVersion(2, 90))
    assert named.regex == {"hostname": "^db"}
