"""The corpus scripts that need TensorFlow, run once for real (marked tf in tests/conftest.py): out of device memory
(TensorFlow's allocator refusing a tensor) and Keras 3's fit under a real two-worker MultiWorkerMirrored cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from orchestrator.diagnosis.classify import JobEnd, classify
from orchestrator.diagnosis.store import TAIL_LINES
from tests.orchestrator.diagnosis.corpus import FAILING, run, task_end
from tests.support.ports import free_ports


def test_out_of_device_memory_is_gpu_oom_with_the_batch_hint(tmp_path):
    code, lines = run("gpu_oom.py", tmp_path)
    assert code == 1, lines

    verdict = classify(JobEnd("failed", "worker 0 on host-a exited with code 1", "mirrored"), [task_end(code, lines)])

    assert (verdict["kind"], verdict["task"]) == ("gpu_oom", "worker 0 on host-a"), verdict
    assert verdict["message"].startswith("worker 0 on host-a ran out of device memory at gpu_oom.py:11: OOM when "
                                         "allocating tensor with shape[4194304,4194304]")  # fmt: skip
    assert "Lower the per-replica batch size" in verdict["hint"]


def test_keras_3_fit_under_two_multi_worker_mirrored_workers_says_to_keep_legacy_keras(tmp_path):
    workers = [f"localhost:{port}" for port in free_ports(2)]
    procs = []
    for index in range(2):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                     "task": {"type": "worker", "index": index}})}  # fmt: skip
        env.pop("TF_USE_LEGACY_KERAS", None)
        procs.append(subprocess.Popen(
            [sys.executable, str(FAILING / "keras3_mwms.py")],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    ends = []
    for index, proc in enumerate(procs):
        _, stderr = proc.communicate(timeout=120)
        lines = stderr.splitlines()[-TAIL_LINES:]
        ends.append(
            task_end(proc.returncode, lines, label=f"worker {index} on host-{index}", index=index, after_s=index)
        )
    assert [end.exit_code for end in ends] == [1, 1], [end.lines[-3:] for end in ends]

    verdict = classify(JobEnd("failed", "worker 0 on host-0 exited with code 1", "multi_worker_mirrored"), ends)

    assert (verdict["kind"], verdict["task"]) == ("keras3_under_mwms_or_ps", "worker 0 on host-0"), verdict
    assert "Keras 3's model.fit, which does not work under MultiWorkerMirrored" in verdict["message"]
    assert verdict["hint"].startswith("Keep the job's legacy Keras on (TF_USE_LEGACY_KERAS=1)")
    assert [p["kind"] for p in verdict["peers"]] == ["keras3_under_mwms_or_ps"]
