"""Sphinx configuration of the tfdash docs site (docs/development/docs.md says why Sphinx + MyST + furo).

Build: `make docs` (strict: every warning is an error, so a broken link or anchor, or a page in no toctree, fails);
tests/test_docs.py builds it the same way in the suite.
"""

project = "tfdash"
author = "the tfdash developers"
copyright = "the tfdash developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "**/.*"]

# Headings up to ### get anchors, so `[text](page.md#a-heading)` is checked like a page link.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
# A link that resolves to nothing is a warning (an error in the strict build), never a plain text fallback.
myst_all_links_external = False
suppress_warnings: list[str] = []

html_theme = "furo"
html_title = "tfdash"
html_static_path: list[str] = []
html_show_sourcelink = False
