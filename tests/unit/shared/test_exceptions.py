"""Errors from the wire are rebuilt only from the allow-list."""

from __future__ import annotations

from typing import Any

import pytest

from shared.exceptions import (
    REMOTE_ALLOWED,
    ConfigError,
    KeelError,
    NoValidHost,
    RemoteError,
    rebuild_remote,
)


class Tripwire(KeelError):
    """A KeelError that must never be built from a remote name."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Tripwire:
        raise AssertionError("a class outside the allow-list was instantiated")


def test_allow_list_names_each_class_by_its_own_name() -> None:
    for name, cls in REMOTE_ALLOWED.items():
        assert cls.__name__ == name
        assert issubclass(cls, KeelError)
    assert "ConfigError" not in REMOTE_ALLOWED
    assert "RemoteError" not in REMOTE_ALLOWED


@pytest.mark.parametrize("name", sorted(REMOTE_ALLOWED))
def test_allowed_name_is_rebuilt_with_the_message_unchanged(name: str) -> None:
    error = rebuild_remote(name, "what the operator must know")
    assert type(error) is REMOTE_ALLOWED[name]
    assert error.message == "what the operator must know"
    assert str(error) == "what the operator must know"


def test_rebuilt_error_keeps_the_remote_wording() -> None:
    original = NoValidHost("no host has 64 GB of RAM free")
    error = rebuild_remote("NoValidHost", original.message)
    assert error.message == original.message


@pytest.mark.parametrize(
    "name",
    [
        "Tripwire",
        "KeelError",
        "ConfigError",
        "RemoteError",
        "SystemExit",
        "Exception",
        "builtins.SystemExit",
        "__class__",
        "",
    ],
)
def test_name_outside_the_allow_list_is_a_remote_error(name: str) -> None:
    error = rebuild_remote(name, "boom")
    assert type(error) is RemoteError
    assert isinstance(error, RemoteError)
    assert (error.exc_type, error.remote_message) == (name, "boom")
    assert error.message == f"{name}: boom"


def test_config_error_is_still_a_keel_error() -> None:
    assert issubclass(ConfigError, KeelError)
    assert issubclass(Tripwire, KeelError)
