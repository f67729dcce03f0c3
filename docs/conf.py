"""Sphinx settings for keel's operator's guide (`make docs`).

The pages are Markdown (MyST). Nothing here reaches the network, and the build fails on
any warning: a link to a page or heading that does not exist is one.
"""

from __future__ import annotations

project = "keel"
author = "keel"
copyright = "keel"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings down to ### get anchors, so `[text](page.md#heading)` links are checked.
myst_heading_anchors = 3

nitpicky = True

html_theme = "alabaster"
html_title = "keel: the operator's guide"
# The pages are the source; no copy of them in the built site.
html_copy_source = False
html_show_sourcelink = False
