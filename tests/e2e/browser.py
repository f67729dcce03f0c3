"""A real browser for the end-to-end tests: Debian's Chromium driven through ChromeDriver.

Only the system's browser (``/usr/bin/chromium``) and driver (``/usr/bin/chromedriver``,
Debian's ``chromium`` and ``chromium-driver``, which ``deploy/dev-servers.sh`` installs)
are used: never one Selenium or anything else would download. Each browser starts
headless with a fresh profile and without any of Chromium's own network traffic. Where
they are missing the tests that need them skip, saying why; under CI (``CI=true``) they
fail instead.

Screenshots go to ``KEEL_SCREENSHOTS`` (default ``.keel/screenshots`` in this checkout);
``.ci/run`` keeps them as artifacts and prints where.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path(os.environ.get("KEEL_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("KEEL_CHROMEDRIVER", "/usr/bin/chromedriver"))
SCREENSHOTS = Path(
    os.environ.get("KEEL_SCREENSHOTS", Path(__file__).resolve().parents[2] / ".keel/screenshots")
)
#: Flags that keep a headless Chromium quiet and self-contained on a build machine.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1366,900",
)
#: Seconds an expected change on the page may take.
WAIT = 20.0

T = TypeVar("T")


def unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser test cannot run under CI: {why}")
    pytest.skip(why)


class Browser:
    """One Chromium window, with the waits the page's live tables need."""

    def __init__(self, driver: webdriver.Chrome, shots: Path) -> None:
        self.driver = driver
        self.shots = shots

    def open(self, url: str) -> None:
        self.driver.get(url)

    def until(self, what: Callable[[webdriver.Chrome], T], timeout: float = WAIT) -> T:
        """``what`` once it returns something true; the page redraws, so a stale element
        only means "ask again"."""
        wait = WebDriverWait(
            self.driver, timeout, poll_frequency=0.2,
            ignored_exceptions=[StaleElementReferenceException],
        )  # fmt: skip
        return wait.until(what)

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def present(self, css: str) -> bool:
        return bool(self.driver.find_elements(By.CSS_SELECTOR, css))

    def text(self, css: str) -> str:
        return self.until(lambda d: d.find_element(By.CSS_SELECTOR, css).text)

    def click(self, css: str) -> None:
        """Click what ``css`` names once it is there and enabled (it may be redrawn)."""

        def clicked(driver: webdriver.Chrome) -> bool:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            if not found or not found[0].is_enabled():
                return False
            found[0].click()
            return True

        self.until(clicked)

    def press(self, css: str, key: str) -> None:
        """Focus what ``css`` names and press ``key`` there (keyboard only, no click)."""

        def pressed(driver: webdriver.Chrome) -> bool:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            if not found or not found[0].is_enabled():
                return False
            found[0].send_keys(key)
            return True

        self.until(pressed)

    def type(self, css: str, text: str) -> None:
        field = self.until(lambda d: d.find_element(By.CSS_SELECTOR, css))
        field.clear()
        field.send_keys(text)

    def screenshot(self, name: str) -> Path:
        """The whole page, below the window's fold too, as ``<name>.png``."""
        metrics = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = metrics["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip}
        )
        path = self.shots / f"{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@contextmanager
def chromium(shots: Path = SCREENSHOTS) -> Iterator[Browser]:
    """A headless Chromium with a fresh profile, closed (and its profile removed) after."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            unavailable(f"{binary} is missing: apt-get install chromium chromium-driver")
    shots.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="keel-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    except WebDriverException as exc:
        shutil.rmtree(profile, ignore_errors=True)
        unavailable(f"Chromium did not start: {exc.msg}")
        raise
    try:
        yield Browser(driver, shots)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
