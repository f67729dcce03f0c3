"""keel-manage's command line: parsing, exit codes and one-line errors (no database)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services.manage.commands.service import table
from services.manage.main import build_parser, run


def test_image_create_parses_every_option() -> None:
    image_id = uuid.uuid4()
    args = build_parser().parse_args(
        ["image", "create", "cirros", "--id", str(image_id), "--min-disk", "1", "--min-ram", "64",
         "--disk-format", "raw", "--container-format", "ovf"]
    )  # fmt: skip
    assert (args.name, args.id, args.min_disk, args.min_ram) == ("cirros", image_id, 1, 64)
    assert (args.disk_format, args.container_format, args.visibility) == ("raw", "ovf", "public")


@pytest.mark.parametrize(
    "argv",
    [
        ["image", "create", "cirros", "--id", "not-a-uuid"],
        ["image", "create", "cirros", "--min-ram", "-1"],
        ["db", "explode"],
        [],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    assert exit_info.value.code == 2
    assert "usage: keel-manage" in capsys.readouterr().err


def test_bad_setting_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KEEL_DATABASE_URL", "mysql://keel@db/keel")
    with pytest.raises(SystemExit) as exit_info:
        run(["db", "version"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("keel-manage: invalid setting KEEL_DATABASE_URL")


def test_unreadable_config_file_is_a_bad_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(["--config", str(tmp_path / "missing.toml"), "service", "list"])
    assert exit_info.value.code == 2
    assert "cannot read config file" in capsys.readouterr().err


def test_database_url_without_database_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KEEL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432")
    assert run(["db", "sync"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "names no database" in err


def test_table_aligns_columns() -> None:
    assert table(("ID", "Host"), [("1", "compute1"), ("12", "c2")]) == (
        "ID  Host\n1   compute1\n12  c2"
    )
