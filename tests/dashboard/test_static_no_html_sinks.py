"""The pages' own scripts build the page from text, never from markup strings: no innerHTML, outerHTML,
insertAdjacentHTML, document.write, eval or `new Function` in dashboard/static (the vendored libraries aside). The one
place a frame's markup goes on the page builds it again from an allow-list (live/markup.js; its real-browser test is
tests/browser/test_job_page_markup.py). And no template carries an inline script or style, which the
Content-Security-Policy (dashboard/csp.py) would refuse."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "dashboard" / "static" / "dashboard"
TEMPLATES = ROOT / "dashboard" / "templates"

HTML_SINK = re.compile(
    r"\.(?:innerHTML|outerHTML)\s*\+?=|insertAdjacentHTML|document\.write|\beval\s*\(|new\s+Function\b|srcdoc"
)
# A <script> with no src= (JSON data blocks from json_script are written by Django as type="application/json"),
# a style element or attribute, an on...= handler attribute, a javascript: URL.
INLINE = re.compile(
    r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>|<style\b|\sstyle\s*=|\son[a-z]+\s*=|javascript:",
    re.IGNORECASE,
)


def test_the_pages_scripts_put_no_markup_string_on_the_page() -> None:
    files = sorted(SCRIPTS.rglob("*.js"))
    assert len(files) >= 7
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in files
        for line in path.read_text().splitlines()
        if not line.lstrip().startswith("//")
        for match in HTML_SINK.finditer(line)
    ]
    assert found == []


def test_the_templates_hold_no_inline_script_or_style() -> None:
    files = sorted(TEMPLATES.rglob("*.html"))
    assert len(files) >= 10
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}" for path in files for match in INLINE.finditer(path.read_text())
    ]
    assert found == []
