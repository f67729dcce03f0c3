"""The operator's guide (docs/*.md) as the tests that hold it to the code read it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of one page of the guide, e.g. ``page("upgrades.md")``."""
    return (DOCS / name).read_text(encoding="utf-8")
