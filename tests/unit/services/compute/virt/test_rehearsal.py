"""The rehearsal wrapper fails the operations it is told to and passes the rest through."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.compute.virt import load_driver
from services.compute.virt.fake import FakeDriver
from services.compute.virt.rehearsal import RehearsalDriver
from shared.config import Settings, VirtSettings, load_settings
from shared.exceptions import BuildFailed, ConfigError
from tests.unit.services.compute.standin import make_spec


async def test_named_operations_fail_and_the_others_run() -> None:
    fake = FakeDriver("host1")
    driver = RehearsalDriver(fake, fail=frozenset({"rebuild"}), delay=0)
    spec = make_spec()

    with pytest.raises(BuildFailed, match="KEEL_VIRT__FAIL_OPERATIONS"):
        await driver.rebuild(spec)
    assert await driver.list_instances() == []
    await driver.spawn(spec)
    assert await driver.list_instances() == [spec.uuid]


def test_load_driver_wraps_only_when_rehearsing(tmp_path: Path) -> None:
    plain = Settings(state_dir=tmp_path)
    assert not isinstance(load_driver(plain), RehearsalDriver)
    rehearsing = Settings(
        state_dir=tmp_path, virt=VirtSettings(fail_operations="spawn, rebuild", delay_s=0.5)
    )
    driver = load_driver(rehearsing)
    assert isinstance(driver, RehearsalDriver)
    assert driver.fail == {"spawn", "rebuild"}
    assert driver.delay == 0.5


def test_unknown_operations_are_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_VIRT__FAIL_OPERATIONS", "spawn,explode")
    with pytest.raises(ConfigError, match=r"KEEL_VIRT__FAIL_OPERATIONS.*explode"):
        load_settings()
