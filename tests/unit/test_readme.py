"""The README is a short introduction: its links into the guide (docs/) lead somewhere.

`make docs` checks the guide's own links; the README is not part of that build.
"""

from __future__ import annotations

import re

from tests.docs import DOCS, ROOT


def heading_anchors(text: str) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub and MyST make them."""
    anchors = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.*)", line)):
            slug = re.sub(r"[^\w\- ]", "", match[1].strip().lower())
            anchors.add(slug.replace(" ", "-"))
    return anchors


def test_the_readme_links_only_to_pages_and_headings_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert links, "the README links into docs/"
    broken = []
    for path, anchor in links:
        target = ROOT / path
        if not target.is_file():
            broken.append(path)
        elif anchor and anchor not in heading_anchors(target.read_text(encoding="utf-8")):
            broken.append(f"{path}#{anchor}")
    assert broken == []


def test_the_readme_links_every_page_of_the_guide() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pages = {path.name for path in DOCS.glob("*.md")}
    linked = set(re.findall(r"\]\(docs/([^)#\s]+\.md)", readme))
    assert pages - linked == set()
