"""scripts/device/gpu_check.sh, the one prepared script for a lent GPU machine, where this suite has none.

Its no-GPU branch runs for real: it says "no GPU" and exits 77. Its checks run against the sampler's fake NVML
(tests/worker_agent/test_sampler.py) and a stand-in `nvidia-smi` printing what the real one prints for
`--query-gpu=... --format=csv,noheader,nounits`, so a mistake in them costs no device time; the MirroredStrategy job
needs a TensorFlow that sees GPUs and is skipped here, as the script says.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.processes import ROOT
from tests.worker_agent.test_sampler import fake_nvml
from worker_agent.sampler import GpuReader

SCRIPT = ROOT / "scripts" / "device" / "gpu_check.sh"
# What nvidia-smi prints for the fake NVML's two GPUs (GPU 1 has no temperature sensor).
SMI_ROWS = [
    "0, NVIDIA H100 80GB HBM3, 81559, 29500, 80, 62, 305.50, 580.159.04",
    "1, NVIDIA A10, 23028, 100, 3, [N/A], 55.00, 580.159.04",
]


def fake_smi(folder: Path, rows: list[str], *, fail: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    smi = folder / "nvidia-smi"
    body = (
        "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9"
        if fail
        else ('if [ "$1" = -L ]; then echo "GPU 0: fake"; exit 0; fi\ncat <<"ROWS"\n' + "\n".join(rows) + "\nROWS")
    )
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    return folder


def run_script(path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_machine_without_nvidia_smi_says_no_gpu_and_exits_77(tmp_path: Path) -> None:
    done = run_script("/usr/bin:/bin")
    assert done.returncode == 77, done.stderr
    assert done.stdout.strip() == "gpu_check: no GPU: nvidia-smi is not on this machine's PATH"


def test_a_driver_that_does_not_answer_says_no_gpu_and_exits_77(tmp_path: Path) -> None:
    bin_dir = fake_smi(tmp_path / "bin", [], fail=True)
    done = run_script(f"{bin_dir}:/usr/bin:/bin")
    assert done.returncode == 77
    assert "gpu_check: no GPU: nvidia-smi -L failed: NVIDIA-SMI has failed" in done.stdout


def test_nvidia_smi_without_nvml_for_python_says_no_gpu(tmp_path: Path) -> None:
    bin_dir = fake_smi(tmp_path / "bin", SMI_ROWS)
    done = run_script(f"{bin_dir}:/usr/bin:/bin")  # this machine's NVML library is missing: the reader says so
    assert done.returncode == 77
    assert done.stdout.startswith("gpu_check: no GPU: NVML unavailable"), done.stdout + done.stderr


@pytest.fixture
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "device" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_without_tensorflow(folder: Path) -> str:
    wrapper = folder / "python-without-tf"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')  # no site-packages: no TensorFlow
    wrapper.chmod(0o755)
    return str(wrapper)


def with_fakes(gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rows: list[str]) -> None:
    nvml = fake_nvml()
    nvml.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    monkeypatch.setattr(gpu_check, "load_reader", lambda: (functools.partial(GpuReader, nvml), ""))
    monkeypatch.setenv("PATH", f"{fake_smi(tmp_path / 'bin', rows)}:{os.environ['PATH']}")
    monkeypatch.setenv("OUT", str(tmp_path))


def test_the_checks_pass_when_the_reader_and_nvidia_smi_agree(gpu_check, monkeypatch, tmp_path, capsys) -> None:
    with_fakes(gpu_check, monkeypatch, tmp_path, SMI_ROWS)

    assert gpu_check.main([python_without_tensorflow(tmp_path)]) == 0

    said = capsys.readouterr().out
    assert "gpu_check: driver: NVML 580.159.04, nvidia-smi 580.159.04" in said
    assert "GPU 1 (reader/nvidia-smi): name NVIDIA A10/NVIDIA A10" in said and "DIFFERS" not in said
    assert "host page reason: This environment's TensorFlow does not import" in said
    assert "MirroredStrategy job skipped: no Python given has a TensorFlow that sees a GPU" in said
    assert said.rstrip().endswith("gpu_check: passed (0 failure(s))")
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["probes"][0]["probe"]["tensorflow"] == ""


def test_a_difference_is_named_and_fails_the_check(gpu_check, monkeypatch, tmp_path, capsys) -> None:
    rows = [SMI_ROWS[0].replace("81559", "40960"), SMI_ROWS[1]]  # nvidia-smi sees another memory size
    with_fakes(gpu_check, monkeypatch, tmp_path, rows)

    assert gpu_check.main([python_without_tensorflow(tmp_path)]) == 1

    said = capsys.readouterr().out
    assert "memory_total_mb 81559/40960.0 DIFFERS" in said
    assert "gpu_check: FAILED idle: GPU 0 memory_total_mb: reader 81559, nvidia-smi 40960.0" in said
