"""The Tempest runner's lists, accounts and counts (tests/tempest)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tempest import config, run

SAMPLE_TOTALS = """\
======
Totals
======
Ran: 12 tests in 3.0 sec.
 - Passed: 7
 - Skipped: 2
 - Expected Fail: 1
 - Unexpected Success: 1
 - Failed: 1
"""


def test_every_exclusion_is_a_valid_regex_with_its_reason_on_the_same_line() -> None:
    lines = [line for line in run.EXCLUDE.read_text().splitlines() if line.strip()]
    entries = [line for line in lines if not line.startswith("#")]
    assert entries
    for line in entries:
        regex, sep, reason = line.partition("#")
        assert sep, f"no reason given: {line!r}"
        assert len(reason.strip()) > 10, f"no reason given: {line!r}"
        assert regex.strip().startswith(r"^tempest\.api\.compute\."), line
        re.compile(regex.strip())


def test_totals_count_expected_failures_as_passes_and_unexpected_successes_as_failures() -> None:
    totals = run.Totals.parse("noise\n" + SAMPLE_TOTALS)
    assert totals == run.Totals(passed=8, failed=2, skipped=2)
    assert totals.line() == "8 passed, 2 failed, 2 skipped"
    assert run.Totals.parse("no totals at all") == run.Totals()


def test_a_slice_keeps_the_include_list_and_adds_the_regex(tmp_path: Path) -> None:
    sliced = run.include_list("servers|flavors", tmp_path)
    patterns = [re.compile(line) for line in sliced.read_text().splitlines()]
    ids = {
        "tempest.api.compute.servers.test_x.T.test_a": True,
        "tempest.api.compute.flavors.test_y.T.test_b": True,
        "tempest.api.compute.keypairs.test_z.T.test_c": False,
        "tempest.api.network.test_servers.T.test_d": False,
    }
    for test_id, wanted in ids.items():
        assert any(p.search(test_id) for p in patterns) is wanted, test_id
    assert run.include_list(None, tmp_path) == run.INCLUDE


def test_alt_accounts_come_first_and_have_projects_of_their_own() -> None:
    found = config.accounts("pw")
    non_admin = [a for a in found if "admin" not in a.tempest_roles]
    first = non_admin[: config.ACCOUNT_SETS]
    assert all(not a.tempest_roles for a in first)
    projects = [a.project for a in found if not a.tempest_roles]
    assert len(set(projects)) == len(projects)
    others = {a.project for a in found if a.tempest_roles}
    assert not others & set(projects)


def test_every_project_of_a_primary_has_a_reader_and_a_manager() -> None:
    found = config.accounts("pw")
    by_project: dict[str, set[str]] = {}
    for account in found:
        for role in account.tempest_roles:
            by_project.setdefault(account.project, set()).add(role)
    members = [p for p, roles in by_project.items() if "member" in roles]
    assert len(members) == config.ACCOUNT_SETS
    for project in members:
        assert by_project[project] == {"member", "reader", "manager"}
    admins = [a for a in found if a.keel_role == "admin"]
    assert len(admins) == config.ACCOUNT_SETS
    assert all(a.tempest_roles == ("admin",) for a in admins)


def test_the_accounts_file_names_each_account_once() -> None:
    text = config.accounts_yaml(config.accounts("secret"))
    assert text.count("- username:") == len(config.accounts("secret"))
    assert '"tempest-1-reader"' in text
    assert 'roles: ["reader"]' in text
