"""What a harness's cloud takes from the harness's own environment, and what it does not."""

from __future__ import annotations

import pytest

from devkit.environment import keel_env


def cloud_env() -> dict[str, str]:
    return keel_env(
        database_url="postgresql://postgres@127.0.0.1:5432/keel",
        transport_url="amqp://guest:guest@127.0.0.1:5672/",
        exchange="keel-test",
        api_bind="127.0.0.1:8774",
    )


def test_the_event_loop_is_passed_on_to_the_clouds_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KEEL_EVENT_LOOP", "uvloop")
    assert cloud_env()["KEEL_EVENT_LOOP"] == "uvloop"
    monkeypatch.setenv("KEEL_EVENT_LOOP", "asyncio")
    assert cloud_env()["KEEL_EVENT_LOOP"] == "asyncio"
    monkeypatch.delenv("KEEL_EVENT_LOOP")
    assert "KEEL_EVENT_LOOP" not in cloud_env()


def test_other_keel_settings_of_the_harness_stay_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("KEEL_QUOTA__INSTANCES", "3")
    monkeypatch.setenv("OS_CLOUD", "mine")
    env = cloud_env()
    assert env["KEEL_LOG_LEVEL"] == "INFO"
    assert "KEEL_QUOTA__INSTANCES" not in env
    assert "OS_CLOUD" not in env
