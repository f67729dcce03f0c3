"""keel-manage network show, run as operators run it."""

from __future__ import annotations

import pytest

from shared.config import NetworkSettings
from tests.functional.services.manage.test_manage import manage

pytestmark = pytest.mark.functional


def test_network_show_prints_the_id_range_and_free_addresses(database_url: str) -> None:
    shown = manage(database_url, "network", "show", KEEL_NETWORK__CIDR="192.168.10.0/24")
    assert shown.returncode == 0, shown.stderr
    lines = {
        line.split("  ")[0].strip(): line.split("  ", 1)[1].strip()
        for line in shown.stdout.splitlines()
    }
    assert lines["id"] == str(NetworkSettings().network_id)
    assert lines["name"] == "private"
    assert lines["cidr"] == "192.168.10.0/24"
    assert lines["gateway"] == "192.168.10.1"
    assert lines["addresses"] == "192.168.10.2 to 192.168.10.254"
    assert (lines["in use"], lines["free"]) == ("0", "253")


def test_a_bad_network_setting_is_exit_2(database_url: str) -> None:
    refused = manage(database_url, "network", "show", KEEL_NETWORK__CIDR="10.0.0.1/16")
    assert refused.returncode == 2
    assert "KEEL_NETWORK__CIDR" in refused.stderr
