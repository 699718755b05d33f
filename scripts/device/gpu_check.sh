#!/usr/bin/env bash
# The GPU path, measured once on a machine with GPUs: run from the repository root as
#     bash scripts/device/gpu_check.sh
# 1. the agent's NVML reader (worker_agent/sampler.py GpuReader) against `nvidia-smi --query-gpu=...`, GPU by GPU;
# 2. the environment probe (worker_agent/runtime/probe.py) and gpu_reason for every Python it finds, so the host
#    page's sentence is seen against a real driver;
# 3. when one of them has a TensorFlow that sees the GPUs: the builtin digits_mlp under MirroredStrategy over all of
#    them, from the runtime set's copy, with the reader sampling while it trains (utilisation, memory, its pid).
# Prints a short summary (and writes it as JSON to $OUT/gpu_check.json when $OUT is set). Exit: 0 checked, 1 a check
# failed, 77 no GPU here (nothing to check: says "no GPU" and why).
# Interpreters: TFDASH_GPU_PYTHON (one with tensorflow[and-cuda], say), the product's .venv/bin/python when it runs
# here, then python3. A Python whose cryptography is missing still loads the reader (see gpu_check.py).
set -uo pipefail
cd "$(dirname "$0")/../.."

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: no GPU: nvidia-smi is not on this machine's PATH"
  exit 77
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no GPU: nvidia-smi -L failed: $(nvidia-smi -L 2>&1 | head -n 1)"
  exit 77
fi

pythons=()
for candidate in ${TFDASH_GPU_PYTHON:-} .venv/bin/python python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    pythons+=("$(command -v "$candidate")")
  fi
done
if [ ${#pythons[@]} -eq 0 ]; then
  echo "gpu_check: no Python 3.10+ to run the checks with (tried TFDASH_GPU_PYTHON, .venv/bin/python, python3)"
  exit 1
fi
# The first Python that runs drives the checks; every one found is probed for its TensorFlow.
PYTHONPATH=. exec "${pythons[0]}" scripts/device/gpu_check.py "${pythons[@]}"
