"""The operator's page in a real browser, against a real cloud, as an operator uses it.

One walk through it, with a screenshot of every state: a member's sign-in refused; an
admin's let in, the hosts listed up; an agent killed and its host forced down (through
the compute API, as another operator would) shown as such within seconds; a host
disabled and enabled again from the page; the dead host's server evacuated from the
page and shown running on the other host; that host drained from the page, the host
task's progress shown until it is done.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from shared.db import projects, users
from shared.objects.identity import ADMIN_ROLE, MEMBER_ROLE
from shared.passwords import hash_password
from tests.e2e.browser import Browser, chromium
from tests.e2e.cloud import Cloud

pytestmark = pytest.mark.e2e

ADMIN_USER, ADMIN_PASSWORD = "page-admin", "page-admin-secret"
MEMBER_USER, MEMBER_PASSWORD = "page-member", "page-member-secret"
#: "Within a few seconds": the page polls every 2 s.
LIVE = 6.0


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as opened:
        yield opened


async def add_users(cloud: Cloud) -> None:
    async with cloud.pool.acquire() as conn:
        project = await projects.create(conn, "page-project")
        await users.create_in_project(
            conn, ADMIN_USER, hash_password(ADMIN_PASSWORD), project, ADMIN_ROLE
        )
        await users.create_in_project(
            conn, MEMBER_USER, hash_password(MEMBER_PASSWORD), project, MEMBER_ROLE
        )


def sign_in(browser: Browser, cloud: Cloud, user: str, password: str) -> None:
    browser.open(f"{cloud.api_url}/ops/")
    browser.type("#username", user)
    browser.type("#password", password)
    browser.click("#login")


def host_row(host: str, **attributes: str) -> str:
    return f'tr[data-host="{host}"]' + "".join(f'[data-{k}="{v}"]' for k, v in attributes.items())


def confirm(browser: Browser, *, reason: str | None = None, shot: str | None = None) -> str:
    """Confirm the open dialog (typing a reason if asked, taking a screenshot of it if
    named); its title."""
    browser.until(lambda d: d.find_element("css selector", "#confirm").is_displayed())
    title = browser.text("#confirm-title")
    if reason is not None:
        browser.type("#confirm-reason", reason)
    if shot is not None:
        browser.screenshot(shot)
    browser.click("#confirm-ok")
    return title


async def force_down(cloud: Cloud, host: str) -> None:
    listed = await cloud.get(f"os-services?host={host}&binary=keel-compute")
    service_id = listed["services"][0]["id"]
    headers = {"OpenStack-API-Version": "compute 2.53"}
    async with cloud.http(cloud.admin_token) as http:
        answer = await http.put(
            f"os-services/{service_id}", json={"forced_down": True}, headers=headers
        )
    assert answer.status_code == 200, answer.text


async def test_an_operator_works_the_fleet_from_the_page(browser: Browser, cloud: Cloud) -> None:
    await add_users(cloud)
    server = await cloud.create_server("on-compute2", host="compute2")

    sign_in(browser, cloud, MEMBER_USER, MEMBER_PASSWORD)
    assert "Sign-in refused" in browser.text(".error")
    assert not browser.present("#hosts")
    browser.screenshot("01-member-refused")

    sign_in(browser, cloud, ADMIN_USER, ADMIN_PASSWORD)
    browser.until(lambda d: d.find_elements("css selector", host_row("compute1", state="up")))
    browser.until(lambda d: d.find_elements("css selector", host_row("compute2", state="up")))
    assert ADMIN_USER in browser.text(".who")
    assert "1 server" in browser.text(f"{host_row('compute2')} td:nth-of-type(6)")
    browser.screenshot("02-hosts-up")

    cloud.processes["compute2"].kill_group()
    await force_down(cloud, "compute2")
    forced_at = time.monotonic()
    browser.until(
        lambda d: d.find_elements("css selector", host_row("compute2", state="forced down")),
        timeout=LIVE,
    )
    shown_after = time.monotonic() - forced_at
    assert shown_after <= LIVE
    browser.screenshot("03-agent-killed-host-forced-down")

    browser.click('button[data-action="disable"][data-host="compute1"]')
    assert confirm(browser, reason="kernel patch", shot="04-disabling") == "Disable compute1?"
    browser.until(lambda d: d.find_elements("css selector", host_row("compute1", disabled="true")))
    assert "disabled: kernel patch" in browser.text(f"{host_row('compute1')} td:nth-of-type(2)")
    browser.screenshot("05-host-disabled")

    # With the keyboard only: the button, then Tab from Cancel to Enable in the dialog.
    browser.press('button[data-action="enable"][data-host="compute1"]', Keys.ENTER)
    browser.until(lambda d: d.find_element("css selector", "#confirm").is_displayed())
    assert browser.driver.switch_to.active_element.get_attribute("id") == "confirm-cancel"
    ActionChains(browser.driver).send_keys(Keys.TAB, Keys.ENTER).perform()
    browser.until(lambda d: d.find_elements("css selector", host_row("compute1", disabled="false")))

    browser.click('button[data-action="evacuate"][data-host="compute2"]')
    title = confirm(browser, shot="06-evacuating")
    assert title == "Evacuate 1 server(s) of compute2?"
    browser.until(lambda d: "evacuation from compute2 accepted" in d.find_element(
        "css selector", "#activity").text)  # fmt: skip

    async def moved() -> bool:
        shown = await cloud.get(f"servers/{server['id']}")
        found = shown["server"]
        return bool(found["status"] == "ACTIVE" and found["OS-EXT-SRV-ATTR:host"] == "compute1")

    deadline = time.monotonic() + 60
    while not await moved():
        assert time.monotonic() < deadline, "the evacuated server did not end on compute1"
        await asyncio.sleep(0.5)
    browser.until(
        lambda d: "1 server" in d.find_element(
            "css selector", f"{host_row('compute1')} td:nth-of-type(6)").text
    )  # fmt: skip
    assert "0 servers" in browser.text(f"{host_row('compute2')} td:nth-of-type(6)")
    browser.until(lambda d: d.find_elements("css selector", '#evacuations tr[data-status="done"]'))
    browser.screenshot("07-server-evacuated")
    await drain_from_the_page(browser, cloud, server["id"])


async def drain_from_the_page(browser: Browser, cloud: Cloud, server_id: str) -> None:
    """A third host joins; the host holding the server is drained from the page."""
    cloud.start("compute3", "keel-compute", "compute3")
    await cloud.wait_for_service("compute3", up=True)
    browser.until(lambda d: d.find_elements("css selector", host_row("compute3", state="up")))
    browser.click('button[data-action="drain"][data-host="compute1"]')
    assert confirm(browser, shot="08-draining") == "Drain compute1?"
    browser.until(lambda d: "drain started (host task" in d.find_element(
        "css selector", "#activity").text)  # fmt: skip
    browser.until(
        lambda d: d.find_elements("css selector", '#host-tasks tr[data-status="done"]'),
        timeout=60,
    )
    assert "1/1 moved" in browser.text('#host-tasks tr[data-status="done"]')
    shown = await cloud.get(f"servers/{server_id}")
    assert (shown["server"]["status"], shown["server"]["OS-EXT-SRV-ATTR:host"]) == (
        "ACTIVE",
        "compute3",
    )
    assert "draining: host task" in browser.text(f"{host_row('compute1')} td:nth-of-type(2)")
    browser.screenshot("09-host-drained")
