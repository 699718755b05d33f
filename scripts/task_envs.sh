#!/usr/bin/env bash
# Build the extra task environments the suite (and a local cluster) can run tasks in, beside the product's .venv:
#   var/envs/tf215: TensorFlow 2.15.1 (CPU) with its own Keras 2.15 (tf.keras is Keras 2), numpy 1.26: the oldest
#                   TensorFlow the runtime claims to work with (docs/admin/gpu-environments.md).
# Idempotent: an environment whose marker file names the same requirements is left alone (no network, ~0 s).
# Not part of `make install` / `make run` (it downloads ~250 MB the first time); .ci/run calls it.
# A failed build leaves <env>.failed holding the reason, which the tests that need the env show when they skip.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVS_DIR=${TFDASH_TASK_ENVS_DIR:-var/envs}

# An interpreter every user can run: tasks run under their own uid when the agent runs as root (--task-uids), and
# pyenv's Pythons under /root (0700) cannot be started by them. TensorFlow 2.15 has wheels for Python 3.9-3.11.
pick_python() {
  local candidate
  for candidate in ${PYTHON:-} /usr/bin/python3.11 /usr/bin/python3.10 /usr/bin/python3.9 /usr/local/bin/python3.11; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys, venv, ensurepip; sys.exit(not (3, 9) <= sys.version_info[:2] <= (3, 11))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# build NAME REQUIREMENT...: a venv at $ENVS_DIR/NAME holding exactly these pins.
build() {
  local name=$1
  shift
  local dir=$ENVS_DIR/$name
  local marker=$dir/.tfdash-env
  local want
  want=$(printf '%s\n' "$@")
  if [ -x "$dir/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; then
    echo "task_envs.sh: $dir is ready ($(echo "$want" | tr '\n' ' '))"
    return 0
  fi
  local python
  if ! python=$(pick_python); then
    echo "no Python 3.9-3.11 with venv found (tried /usr/bin/python3.11, 3.10, 3.9; PYTHON overrides)" >"$dir.failed"
    echo "task_envs.sh: $(cat "$dir.failed")" >&2
    return 1
  fi
  local started=$SECONDS
  echo "task_envs.sh: building $dir with $python: $*"
  rm -rf "$dir" "$dir.failed"
  mkdir -p "$ENVS_DIR"
  chmod 755 "$ENVS_DIR"
  local log=$ENVS_DIR/$name.log
  if ! {
    "$python" -m venv "$dir" &&
      "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
  } >"$log" 2>&1; then
    { echo "building $dir failed (log: $log):"; tail -n 5 "$log"; } >"$dir.failed"
    cat "$dir.failed" >&2
    return 1
  fi
  chmod -R go-w,go+rX "$dir" # readable and runnable by task uids, writable by no task
  echo "$want" >"$marker"
  echo "task_envs.sh: built $dir in $((SECONDS - started)) s"
}

build tf215 tensorflow-cpu==2.15.1 numpy==1.26.4
