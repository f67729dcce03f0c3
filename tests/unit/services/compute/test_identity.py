"""The node identity file: read from every copy, created once, never replaced."""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import pytest

from services.compute import identity
from shared.exceptions import ConfigError


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_created_once_with_its_state_dir(tmp_path: Path) -> None:
    state_dir = tmp_path / "var" / "lib" / "keel"
    node_uuid = uuid.uuid4()

    assert identity.create_identity(state_dir, node_uuid) == node_uuid

    path = state_dir / "compute_id"
    assert path.read_text() == f"{node_uuid}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert _files(state_dir) == ["compute_id"]
    assert identity.read_identity(state_dir).node_uuid == node_uuid


def test_no_copy_anywhere_is_no_identity(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "keel.toml"
    found = identity.read_identity(tmp_path / "state", config)

    assert found.node_uuid is None
    assert found.found == ()
    assert found.candidates == (tmp_path / "state" / "compute_id", config.parent / "compute_id")
    assert found.describe() == str(tmp_path / "state" / "compute_id")


def test_pre_provisioned_identity_is_honoured_and_left_as_written(tmp_path: Path) -> None:
    provisioned = uuid.uuid4()
    path = tmp_path / "compute_id"
    path.write_text(f"  {str(provisioned).upper()}\n")
    before = path.read_bytes()

    assert identity.read_identity(tmp_path).node_uuid == provisioned
    assert path.read_bytes() == before


def test_copy_beside_the_config_file_is_honoured(tmp_path: Path) -> None:
    provisioned = uuid.uuid4()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "compute_id").write_text(f"{provisioned}\n")

    found = identity.read_identity(tmp_path / "state", tmp_path / "etc" / "keel.toml")

    assert found.node_uuid == provisioned
    assert found.found == (tmp_path / "etc" / "compute_id",)
    assert not (tmp_path / "state").exists()


def test_agreeing_copies_are_one_identity(tmp_path: Path) -> None:
    node_uuid = uuid.uuid4()
    for directory in ("state", "etc"):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "compute_id").write_text(f"{node_uuid}\n")

    found = identity.read_identity(tmp_path / "state", tmp_path / "etc" / "keel.toml")

    assert found.node_uuid == node_uuid
    assert len(found.found) == 2


def test_config_file_in_the_state_dir_is_one_copy(tmp_path: Path) -> None:
    node_uuid = uuid.uuid4()
    (tmp_path / "compute_id").write_text(f"{node_uuid}\n")

    found = identity.read_identity(tmp_path, tmp_path / "keel.toml")

    assert found.candidates == (tmp_path / "compute_id",)
    assert found.node_uuid == node_uuid


def test_conflicting_copies_are_refused_naming_both_files(tmp_path: Path) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    for directory, value in (("state", first), ("etc", second)):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "compute_id").write_text(f"{value}\n")

    with pytest.raises(ConfigError, match="disagree") as info:
        identity.read_identity(tmp_path / "state", tmp_path / "etc" / "keel.toml")

    message = info.value.message
    assert f"{tmp_path / 'state' / 'compute_id'} holds {first}" in message
    assert f"{tmp_path / 'etc' / 'compute_id'} holds {second}" in message


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
        identity.read_identity(tmp_path)

    assert str(path) in info.value.message
    assert "corrupt" in info.value.message
    assert path.read_bytes() == content
    assert _files(tmp_path) == ["compute_id"]


def test_corrupt_copy_beside_the_config_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "compute_id").write_text(f"{uuid.uuid4()}\n")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "compute_id").write_text("garbage\n")

    with pytest.raises(ConfigError, match="corrupt") as info:
        identity.read_identity(tmp_path, tmp_path / "etc" / "keel.toml")

    assert str(tmp_path / "etc" / "compute_id") in info.value.message


def test_oversized_file_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "compute_id").write_text(str(uuid.uuid4()) + " " * 10_000)

    with pytest.raises(ConfigError, match="corrupt"):
        identity.read_compute_id(tmp_path)


def test_unreadable_identity_is_a_clear_refusal(tmp_path: Path) -> None:
    (tmp_path / "compute_id").mkdir()

    with pytest.raises(ConfigError, match="cannot read the node identity file"):
        identity.read_identity(tmp_path)

    assert (tmp_path / "compute_id").is_dir()


def test_write_never_overwrites_an_existing_identity(tmp_path: Path) -> None:
    existing = identity.create_identity(tmp_path, uuid.uuid4())

    on_disk = identity.write_compute_id(tmp_path, uuid.uuid4())

    assert on_disk == existing
    assert identity.read_compute_id(tmp_path) == existing
    assert _files(tmp_path) == ["compute_id"]


def test_creating_over_a_racing_writer_is_refused(tmp_path: Path) -> None:
    winner = identity.create_identity(tmp_path, uuid.uuid4())

    with pytest.raises(ConfigError, match="another process wrote"):
        identity.create_identity(tmp_path, uuid.uuid4())

    assert identity.read_compute_id(tmp_path) == winner


def test_read_without_file_is_none(tmp_path: Path) -> None:
    assert identity.read_compute_id(tmp_path / "missing") is None
