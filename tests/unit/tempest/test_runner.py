"""The Tempest runner's lists, configuration and counts (tests/tempest)."""

from __future__ import annotations

import configparser
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


def test_tempest_makes_its_own_accounts_with_the_admin_it_is_given(tmp_path: Path) -> None:
    cloud = config.Cloud(
        api_url="http://127.0.0.1:1",
        image_ref="i",
        image_ref_alt="j",
        flavor_ref="1",
        flavor_ref_alt="2",
        compute_nodes=2,
    )
    admin = config.Admin("tempest-admin", "tempest-admin", "s3cret")
    parsed = configparser.ConfigParser()
    parsed.read_string(config.tempest_conf(cloud, tmp_path, admin))
    auth = parsed["auth"]
    assert auth.getboolean("use_dynamic_credentials") is True
    assert "test_accounts_file" not in auth
    assert (auth["admin_username"], auth["admin_project_name"]) == ("tempest-admin",) * 2
    assert auth["admin_password"] == "s3cret"
    assert auth["admin_domain_name"] == "Default"
    assert parsed["identity"]["uri_v3"] == "http://127.0.0.1:1/identity/v3"
