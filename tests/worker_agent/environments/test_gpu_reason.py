"""gpu_reason: why an environment's TensorFlow cannot use the host's GPUs, from NVML's count and driver and the
probe's line (worker_agent/runtime/probe.py).

The CPU-only and no-TensorFlow lines were recorded here (2-core machine, no GPU) from the product's venv, the
TensorFlow 2.15 environment of scripts/task_envs.sh and a Python without TensorFlow; the CUDA builds' lines are
written in the probe's format with the values of TensorFlow 2.15's CUDA wheel (CUDA 12.2, cuDNN 8), since no GPU
machine runs this suite.
"""

from __future__ import annotations

import pytest

from worker_agent.environments.gpu_reason import driver_floor, gpu_reason, parse_driver

# Recorded: `-m worker_agent.runtime.probe` under .venv/bin/python, var/envs/tf215/bin/python, /usr/bin/python3.
PRODUCT_CPU = {"cuda_build": "", "cudnn_build": "", "error": "", "gpus": [], "keras": "3.15.1",
               "keras_flavor": "keras3", "python": "3.11.2", "tensorflow": "2.21.0"}  # fmt: skip
TF215_CPU = {"cuda_build": "", "cudnn_build": "", "error": "", "gpus": [], "keras": "2.15.0",
             "keras_flavor": "keras2", "python": "3.11.2", "tensorflow": "2.15.1"}  # fmt: skip
NO_TF = {"cuda_build": "", "cudnn_build": "", "gpus": [], "keras": "", "keras_flavor": "", "python": "3.11.2",
         "tensorflow": "",
         "error": "import tensorflow failed: ModuleNotFoundError: No module named 'tensorflow'"}  # fmt: skip
# Written in the probe's format: `pip install tensorflow[and-cuda]==2.15.1`, on a host with 4 GPUs.
TF215_CUDA = {"cuda_build": "12.2", "cudnn_build": "8", "error": "", "keras": "2.15.0", "keras_flavor": "keras2",
              "python": "3.11.2", "tensorflow": "2.15.1",
              "gpus": [f"/physical_device:GPU:{i}" for i in range(4)]}  # fmt: skip
DRIVER = "535.104.05"


def test_a_host_without_gpus_has_no_reason_whatever_its_environment() -> None:
    for probe in (PRODUCT_CPU, TF215_CPU, NO_TF, TF215_CUDA):
        assert gpu_reason(0, "", probe) == ""


def test_a_cuda_build_that_sees_every_gpu_has_no_reason() -> None:
    assert gpu_reason(4, DRIVER, TF215_CUDA) == ""


@pytest.mark.parametrize("probe", [PRODUCT_CPU, TF215_CPU], ids=["tensorflow-cpu 2.21", "tensorflow-cpu 2.15"])
def test_a_cpu_only_build_is_named_with_what_to_install(probe: dict) -> None:
    reason = gpu_reason(2, DRIVER, probe)
    assert f"TensorFlow {probe['tensorflow']} here is a CPU-only build" in reason
    assert f"pip install 'tensorflow[and-cuda]=={probe['tensorflow']}'" in reason
    assert "2 GPUs NVML reports" in reason


def test_an_environment_without_tensorflow_says_why() -> None:
    reason = gpu_reason(1, DRIVER, NO_TF)
    assert "does not import (import tensorflow failed: ModuleNotFoundError" in reason
    assert "tensorflow[and-cuda]" in reason


def test_a_cuda_build_without_its_libraries_sees_no_gpu() -> None:
    # `pip install tensorflow` without [and-cuda]: built with CUDA, but libcudart/cuDNN are not there to load.
    probe = {**TF215_CUDA, "gpus": []}
    reason = gpu_reason(4, DRIVER, probe)
    assert "TensorFlow 2.15.1 is built with CUDA 12.2 but sees none of the 4 GPUs NVML reports" in reason
    assert "its CUDA libraries are missing" in reason and "tensorflow[and-cuda]==2.15.1" in reason


@pytest.mark.parametrize(
    ("driver", "cuda", "too_old"),
    [
        ("470.223.02", "12.2", True),  # an 11.x-era driver under a CUDA 12 build
        ("525.60.13", "12.2", False),  # CUDA 12's floor itself: minor version compatibility
        ("535.104.05", "12.5", False),
        ("570.86.10", "13.0", True),
        ("580.65.06", "13.0", False),
    ],
)
def test_a_driver_older_than_the_builds_cuda_needs_is_named(driver: str, cuda: str, too_old: bool) -> None:
    probe = {**TF215_CUDA, "cuda_build": cuda, "gpus": []}
    reason = gpu_reason(4, driver, probe)
    assert ("upgrade the driver" in reason) is too_old
    if too_old:
        assert f"built for CUDA {cuda}, which needs NVIDIA driver" in reason and driver in reason
    else:
        assert "CUDA libraries are missing" in reason


def test_an_unknown_driver_falls_back_to_the_libraries() -> None:
    assert "CUDA libraries are missing" in gpu_reason(4, "", {**TF215_CUDA, "gpus": []})


def test_fewer_gpus_than_nvml_reports_is_named() -> None:
    probe = {**TF215_CUDA, "gpus": TF215_CUDA["gpus"][:2]}
    reason = gpu_reason(4, DRIVER, probe)
    assert reason.startswith("TensorFlow 2.15.1 sees 2 of the 4 GPUs NVML reports")
    assert "CUDA_VISIBLE_DEVICES" in reason


def test_a_probe_that_could_not_list_devices_says_so() -> None:
    probe = {**TF215_CUDA, "gpus": [], "error": "listing TensorFlow's devices failed: RuntimeError: CUDA error"}
    reason = gpu_reason(1, DRIVER, probe)
    assert "could not list its GPUs (listing TensorFlow's devices failed: RuntimeError: CUDA error)" in reason


def test_every_reason_is_one_sentence_on_one_line() -> None:
    probes = [PRODUCT_CPU, NO_TF, {**TF215_CUDA, "gpus": []}, {**TF215_CUDA, "gpus": ["/physical_device:GPU:0"]}]
    for probe in probes:
        reason = gpu_reason(4, "470.1", probe)
        assert reason and "\n" not in reason and reason.endswith(".")


def test_driver_versions_and_floors_parse() -> None:
    assert parse_driver("535.104.05") == (535, 104, 5)
    assert parse_driver("") is None and parse_driver("N/A") is None
    assert driver_floor("12.2") == (525, 60, 13) and driver_floor("11.8") == (450, 80, 2)
    assert driver_floor("") is None and driver_floor("99.0") is None
