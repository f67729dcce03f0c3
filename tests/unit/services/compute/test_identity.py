"""The node identity file: created once, honoured when present, never replaced."""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import pytest

from services.compute import identity
from shared.exceptions import ConfigError


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_created_when_absent_with_state_dir(tmp_path: Path) -> None:
    state_dir = tmp_path / "var" / "lib" / "keel"

    node_uuid = identity.load_or_create(state_dir)

    path = state_dir / "compute_id"
    assert path.read_text() == f"{node_uuid}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert _files(state_dir) == ["compute_id"]


def test_reused_on_every_later_start(tmp_path: Path) -> None:
    first = identity.load_or_create(tmp_path)

    assert identity.load_or_create(tmp_path) == first
    assert identity.load_or_create(tmp_path) == first


def test_pre_provisioned_identity_is_honoured_and_left_as_written(tmp_path: Path) -> None:
    provisioned = uuid.uuid4()
    path = tmp_path / "compute_id"
    path.write_text(f"  {str(provisioned).upper()}\n")
    before = path.read_bytes()

    assert identity.load_or_create(tmp_path) == provisioned
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "content",
    [b"", b"\n", b"not-a-uuid\n", f"{uuid.uuid4()} {uuid.uuid4()}\n".encode(), b"\xff\xfe"],
    ids=["empty", "blank", "garbage", "two-uuids", "binary"],
)
def test_corrupt_file_is_a_clear_refusal_and_is_not_replaced(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "compute_id"
    path.write_bytes(content)

    with pytest.raises(ConfigError) as info:
        identity.load_or_create(tmp_path)

    assert str(path) in info.value.message
    assert "corrupt" in info.value.message
    assert path.read_bytes() == content
    assert _files(tmp_path) == ["compute_id"]


def test_oversized_file_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "compute_id").write_text(str(uuid.uuid4()) + " " * 10_000)

    with pytest.raises(ConfigError, match="corrupt"):
        identity.read_compute_id(tmp_path)


def test_unreadable_identity_is_a_clear_refusal(tmp_path: Path) -> None:
    (tmp_path / "compute_id").mkdir()

    with pytest.raises(ConfigError, match="cannot read the node identity file"):
        identity.load_or_create(tmp_path)

    assert (tmp_path / "compute_id").is_dir()


def test_write_never_overwrites_an_existing_identity(tmp_path: Path) -> None:
    existing = identity.load_or_create(tmp_path)

    on_disk = identity.write_compute_id(tmp_path, uuid.uuid4())

    assert on_disk == existing
    assert identity.read_compute_id(tmp_path) == existing
    assert _files(tmp_path) == ["compute_id"]


def test_read_without_file_is_none(tmp_path: Path) -> None:
    assert identity.read_compute_id(tmp_path / "missing") is None
