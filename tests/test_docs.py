"""The docs site builds in strict mode, and the README stays a page that routes.

The site is Sphinx + MyST-Parser + furo over docs/ (docs/conf.py; why: docs/development/docs.md). Strict means every
warning is an error: a link to a page or file that does not exist, a link to a heading that does not exist, a page
that no toctree lists, a missing image. The throwaway sites below show that the strict build fails on each of those,
so a green build here means the site has none.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250
# The same flags as `make docs`: -W warnings are errors, --keep-going reports them all, -n nitpicky references.
STRICT = ["-W", "--keep-going", "-n", "-q", "-b", "html"]


def build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", *STRICT, str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_readme_is_a_page_that_routes() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move text to docs/"
    )


def test_the_docs_site_builds_in_strict_mode_with_every_page(tmp_path: Path) -> None:
    out = tmp_path / "html"
    result = build(DOCS, out)
    assert result.returncode == 0, f"the docs site does not build in strict mode:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr
    # Sphinx warns of a page in no toctree; this also catches a page the configuration would leave out altogether.
    pages = {p.relative_to(DOCS).with_suffix("") for p in DOCS.rglob("*.md") if "_build" not in p.parts}
    built = {
        p.relative_to(out).with_suffix("")
        for p in out.rglob("*.html")
        if not p.relative_to(out).parts[0].startswith("_")
    }
    assert pages <= built, f"pages not built: {sorted(map(str, pages - built))}"
    assert Path("sizing") in built


BROKEN = {
    "a link to a page that does not exist": (
        {"a.md": "# A\n\n[gone](no-such-page.md)\n"},
        "cross-reference target not found: 'no-such-page.md'",
    ),
    "a link to a heading that does not exist": (
        {"a.md": "# A\n\n## A heading\n\n[gone](a.md#no-such-heading)\n"},
        "local id not found in doc 'a': 'no-such-heading'",
    ),
    "a page in no toctree": (
        {"a.md": "# A\n", "orphan.md": "# Left out\n"},
        "document isn't included in any toctree",
    ),
    "a missing image": (
        {"a.md": "# A\n\n![gone](img/no-such.png)\n"},
        "image file not readable",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_the_strict_build_fails_on(case: str, tmp_path: Path) -> None:
    files, warning = BROKEN[case]
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(DOCS / "conf.py", site / "conf.py")
    (site / "index.md").write_text("# Home\n\n```{toctree}\na\n```\n")
    for name, text in files.items():
        (site / name).write_text(text)
    result = build(site, tmp_path / "html")
    assert result.returncode != 0, f"the strict build passed with {case}"
    assert warning in result.stderr, result.stderr
