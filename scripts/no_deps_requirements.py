"""Print the requirements that must be installed with `pip install --no-deps` ([tool.tfdash] in pyproject.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
print("\n".join(tomllib.loads(pyproject.read_text())["tool"]["tfdash"]["install-no-deps"]))
