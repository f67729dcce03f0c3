"""Settings: KEEL_* environment over the TOML file over defaults; bad values named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.config import load_settings
from shared.exceptions import ConfigError


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without any KEEL_* variable the shell may have set."""
    for name in list(os.environ):
        if name.startswith("KEEL_"):
            monkeypatch.delenv(name)


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keel.toml"
    path.write_text(text)
    return path


def test_defaults_without_file_or_environment() -> None:
    settings = load_settings()
    assert settings.exchange == "keel"
    assert settings.report_interval == 10.0
    assert settings.compute.vcpus is None
    assert settings.rpc.queue_expires is None


def test_file_overrides_defaults(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'exchange = "prod"\nreport_interval = 5\n[compute]\nvcpus = 4\n')
    settings = load_settings(path)
    assert (settings.exchange, settings.report_interval) == ("prod", 5.0)
    assert settings.compute.vcpus == 4


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _toml(tmp_path, 'exchange = "prod"\nreport_interval = 5\n')
    monkeypatch.setenv("KEEL_REPORT_INTERVAL", "7.5")
    settings = load_settings(path)
    assert settings.report_interval == 7.5
    assert settings.exchange == "prod"


def test_nested_environment_overrides_one_field_of_a_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, '[compute]\nvcpus = 4\ndriver = "fake"\n')
    monkeypatch.setenv("KEEL_COMPUTE__VCPUS", "8")
    settings = load_settings(path)
    assert settings.compute.vcpus == 8
    assert settings.compute.driver == "fake"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KEEL_REPORT_INTERVAL", "soon"),
        ("KEEL_REPORT_INTERVAL", "-1"),
        ("KEEL_COMPUTE__VCPUS", "0"),
        ("KEEL_RPC__PREFETCH", "many"),
        ("KEEL_TRANSPORT_URL", "http://127.0.0.1:5672/"),
        ("KEEL_API_BIND", "8774"),
        ("KEEL_EXCHANGE", "has spaces"),
    ],
)
def test_bad_environment_value_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.message.startswith(f"invalid setting {name}:")
    assert "\n" not in caught.value.message


def test_bad_file_value_names_the_setting(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[rpc]\nprefetch = 0\n")
    with pytest.raises(ConfigError, match="KEEL_RPC__PREFETCH"):
        load_settings(path)


def test_file_tokens_are_read(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[auth.tokens.tok-1]\nuser_id = "u"\nproject_id = "p"\n')
    token = load_settings(path).auth.tokens["tok-1"]
    assert (token.user_id, token.project_id, token.roles) == ("u", "p", ["member"])


def test_bad_token_entry_does_not_reveal_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, '[auth.tokens.s3cr3t-admin-token]\nproject_id = "p"\n')
    with pytest.raises(ConfigError) as from_file:
        load_settings(path)
    monkeypatch.setenv("KEEL_AUTH__TOKENS", '{"s3cr3t-admin-token": {"user_id": 1}}')
    with pytest.raises(ConfigError) as from_env:
        load_settings()
    for caught in (from_file, from_env):
        assert "KEEL_AUTH__TOKENS" in caught.value.message
        assert "user_id" in caught.value.message
        assert "s3cr3t" not in caught.value.message.lower()


def test_unknown_file_key_is_refused(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[compute]\nvcpu = 4\n")
    with pytest.raises(ConfigError, match="KEEL_COMPUTE__VCPU:"):
        load_settings(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "absent.toml")


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path)


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    path = _toml(tmp_path, "report_interval = = 5\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings(path)


def test_down_time_must_outlast_the_report_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_REPORT_INTERVAL", "30")
    monkeypatch.setenv("KEEL_SERVICE_DOWN_TIME", "20")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "KEEL_SERVICE_DOWN_TIME (20s) must be longer than KEEL_REPORT_INTERVAL" in (
        caught.value.message
    )
    assert "\n" not in caught.value.message
