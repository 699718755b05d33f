#!/usr/bin/env bash
# Create .venv and install the project with its pinned dependencies; idempotent (make calls it when pyproject changes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
# Packages that must come without their declared dependencies (see [tool.tfdash] in pyproject.toml).
mapfile -t nodeps < <(.venv/bin/python scripts/no_deps_requirements.py)
.venv/bin/python -m pip install --quiet --no-deps "${nodeps[@]}"
touch .venv/.installed
