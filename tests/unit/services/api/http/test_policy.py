from __future__ import annotations

from pathlib import Path

import pytest

from services.api.http.faults import Forbidden
from services.api.http.policy import (
    DEFAULTS,
    FORCED_HOST,
    REQUESTED_DESTINATION,
    Policy,
    PolicyError,
)
from shared.context import RequestContext

ADMIN = RequestContext(user_id="root", project_id="ops", roles=("admin",))
MEMBER = RequestContext(user_id="alice", project_id="team", roles=("member",))
READER = RequestContext(user_id="rita", project_id="team", roles=("reader",))
NOBODY = RequestContext()


def test_defaults_are_admin_only() -> None:
    policy = Policy()
    for rule in (REQUESTED_DESTINATION, FORCED_HOST):
        assert policy.allows(rule, ADMIN)
        assert not policy.allows(rule, MEMBER)
    with pytest.raises(Forbidden, match="Policy doesn't allow compute:servers:create:requested_"):
        policy.enforce(REQUESTED_DESTINATION, MEMBER)


@pytest.mark.parametrize(
    ("text", "admin", "member", "reader", "nobody"),
    [
        ("", True, True, True, True),
        ("@", True, True, True, True),
        ("!", False, False, False, False),
        ("role:member", False, True, False, False),
        ("role:MEMBER or role:reader", False, True, True, False),
        ("not role:admin", False, True, True, True),
        ("project_id:%(project_id)s", True, True, True, False),
        ("(role:member or role:admin) and not role:reader", True, True, False, False),
        ("rule:admin_api or (role:reader and user_id:%(user_id)s)", True, False, True, False),
        ("is_admin:True", True, False, False, False),
    ],
)
def test_check_strings(text: str, admin: bool, member: bool, reader: bool, nobody: bool) -> None:
    policy = Policy({REQUESTED_DESTINATION: text})
    assert [policy.allows(REQUESTED_DESTINATION, c) for c in (ADMIN, MEMBER, READER, NOBODY)] == [
        admin,
        member,
        reader,
        nobody,
    ]


def test_the_draft_name_is_an_alias() -> None:
    policy = Policy({"os_compute_api:servers:create:requested_destination": "@"})
    assert policy.allows(REQUESTED_DESTINATION, MEMBER)
    assert policy.rule(REQUESTED_DESTINATION) == "@"


def test_changing_admin_api_changes_the_rules_that_refer_to_it() -> None:
    policy = Policy({"admin_api": "role:operator"})
    operator = RequestContext(roles=("operator",))
    assert policy.allows(FORCED_HOST, operator)
    assert not policy.allows(FORCED_HOST, ADMIN)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("role:admin or", "ends too early"),
        ("(role:admin", "ends too early"),
        ("(role:admin or role:member role:reader)", "not closed"),
        ("role:admin role:member", "unexpected"),
        ("admin", "not a check"),
        ("rule:nowhere", "unknown rule"),
        ("tenant:%(tenant)s", "does not know the check"),
    ],
)
def test_rules_that_cannot_be_read_are_refused(text: str, why: str) -> None:
    with pytest.raises(PolicyError, match=why):
        Policy({REQUESTED_DESTINATION: text})


def test_rules_that_refer_to_each_other_in_a_loop_are_refused() -> None:
    with pytest.raises(PolicyError, match="loop"):
        Policy({"admin_api": f"rule:{FORCED_HOST}"})


def test_a_policy_file_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text('"os_compute_api:servers:create:forced_host": "role:member"\n')
    policy = Policy.load(path)
    assert policy.allows(FORCED_HOST, MEMBER)
    assert policy.rule(REQUESTED_DESTINATION) == DEFAULTS[REQUESTED_DESTINATION]


def test_an_empty_file_or_none_keeps_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("")
    assert Policy.load(path).rule(FORCED_HOST) == "rule:admin_api"
    assert Policy.load(None).rule(FORCED_HOST) == "rule:admin_api"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("- a list\n", "must map rule names"),
        ("'a': [1]\n", "must be a check string"),
        ("'compute:servers:delete': '@'\n", "unknown rule"),
        ("a: b: c\n", "cannot read"),
    ],
)
def test_bad_policy_files_stop_keel_api(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(content)
    with pytest.raises(PolicyError, match=why):
        Policy.load(path)


def test_a_missing_policy_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        Policy.load(tmp_path / "absent.yaml")
