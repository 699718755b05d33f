#!/usr/bin/env bash
# Create .venv and install the project with its pinned dependencies; idempotent (make calls it when pyproject changes).
set -euo pipefail
cd "$(dirname "$0")/.."

# The venv's python is a link to its base interpreter, and task processes run it under their own user id when the
# agent runs as root (--task-uids): so prefer an interpreter every user can run (a system one) over e.g. pyenv's
# under /root, which is 0700. PYTHON overrides; the last resorts are whatever python3.11/python3 the PATH gives.
usable() { "$1" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; }
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in /usr/bin/python3.11 /usr/local/bin/python3.11 python3.11 python3; do
    if command -v "$candidate" >/dev/null && usable "$candidate"; then
      PYTHON=$candidate
      break
    fi
  done
fi
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Say so when the venv's interpreter lives where another user cannot reach it (the agent's --task-uids check would
# refuse to start): the cure is a venv made from a system Python.
base=$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys._base_executable))')
dir=$(dirname "$base")
while [ "$dir" != "/" ]; do
  if [ "$(( 0$(stat -c %a "$dir") & 1 ))" -eq 0 ]; then
    echo "install.sh: note: $base is under $dir, which other users cannot enter; tasks run under --task-uids" \
      "cannot start it. Recreate the venv from a system Python: rm -rf .venv && PYTHON=/usr/bin/python3.11 make install" >&2
    break
  fi
  dir=$(dirname "$dir")
done
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
# Packages that must come without their declared dependencies (see [tool.tfdash] in pyproject.toml).
mapfile -t nodeps < <(.venv/bin/python scripts/no_deps_requirements.py)
.venv/bin/python -m pip install --quiet --no-deps "${nodeps[@]}"
touch .venv/.installed
