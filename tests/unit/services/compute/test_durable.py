"""Durable writes: a new file appears whole, and an existing one is never replaced."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from services.compute.durable import create_once, write_synced


def test_create_once_creates_the_file_whole_with_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "id"

    assert create_once(path, b"first\n", 0o640)

    assert path.read_bytes() == b"first\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["id"]


def test_create_once_never_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "id"
    path.write_bytes(b"already here\n")

    assert not create_once(path, b"second\n", 0o644)

    assert path.read_bytes() == b"already here\n"
    assert [p.name for p in tmp_path.iterdir()] == ["id"]


def test_write_synced_refuses_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    write_synced(path, b"{}")

    with pytest.raises(FileExistsError):
        write_synced(path, b"[]")

    assert path.read_bytes() == b"{}"
