"""keel-fence's process: the host watchdog it may hold, and its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.fence.main import guard, watchdog_device
from shared.config import FencingSettings, Settings
from shared.exceptions import ConfigError
from shared.runtime import Lifecycle


def test_the_watchdog_is_petted_at_each_look_and_disarmed_on_a_clean_exit(
    tmp_path: Path,
) -> None:
    device = tmp_path / "watchdog"
    device.write_bytes(b"")

    with watchdog_device(device) as pet:
        assert pet is not None
        pet()
        pet()

    assert device.read_bytes() == b"\0\0V", "two pets, then the magic close"


def test_without_a_device_nothing_is_held() -> None:
    with watchdog_device(None) as pet:
        assert pet is None


async def test_with_fencing_off_there_is_nothing_to_guard(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, fencing=FencingSettings(self_fence_after=0))

    await guard(settings, Lifecycle())

    assert not (tmp_path / "fence.lock").exists()


async def test_a_host_whose_agent_never_registered_has_no_fence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no node identity"):
        await guard(Settings(state_dir=tmp_path), Lifecycle())
