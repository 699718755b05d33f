"""Every failing script of the corpus that fails on its own (no cluster, no TensorFlow) is run once for real, and its
real exit status and output give the verdict's cause task, kind, message and hint. The cluster cases are in the e2e
tests (test_jobs_e2e.py, test_faults_e2e.py, test_preemption_e2e.py, test_ps_tutorial_e2e.py), the TensorFlow ones in
test_corpus_tf.py."""

from __future__ import annotations

import pytest

from orchestrator.diagnosis.classify import JobEnd, classify
from tests.orchestrator.diagnosis.corpus import run, task_end

# script, kind, what the message says, what the hint says
CASES = [
    ("user_exception.py", "user_exception",
     "raised ValueError at user_exception.py:8: bad shape (64, 10) for layer dense_1",
     "Fix the error at user_exception.py:8"),
    ("user_exception_in_callback.py", "user_exception", "raised KeyError at user_exception_in_callback.py:12: 'label'",
     "Fix the error at user_exception_in_callback.py:12"),
    ("user_exception_chained.py", "user_exception",
     "raised RuntimeError at user_exception_chained.py:12: config 'epochs' must be a whole number",
     "Fix the error at user_exception_chained.py:12"),
    ("host_oom_memory_error.py", "host_oom", "ran out of host memory (MemoryError) at host_oom_memory_error.py:13",
     "Use less memory per process"),
    ("host_oom_killed.py", "host_oom", "was killed by SIGKILL (killed by signal 9 (SIGKILL)) that the product did not "
     "send", "dmesg"),
    ("missing_import.py", "missing_import", "could not import tensorflow_addons at missing_import.py:5",
     "Install the package in the job's environment"),
    ("import_error_name.py", "missing_import", "failed to import at import_error_name.py:6: cannot import name "
     "'Mapping' from 'collections'", "Install the versions the script expects"),
    ("missing_data_file.py", "missing_file", "could not find data/digits_train.npz at missing_data_file.py:10 on "
     "host-a", "$TFDASH_JOB_DIR"),
    ("port_taken.py", "port_taken", "could not listen on a port another process holds: OSError: [Errno 98] Address "
     "already in use", "stop whatever holds it"),
    ("exits_quietly.py", "unknown", "failed (exit code 3); its last words: validation accuracy 0.07 is below 0.5: "
     "giving up", "Read the task's log"),
    ("aborts.py", "unknown", "failed (killed by signal 6 (SIGABRT)); its last words: F0000 check failed",
     "Read the task's log"),
]  # fmt: skip


@pytest.mark.parametrize(("script", "kind", "message", "hint"), CASES, ids=[case[0] for case in CASES])
def test_a_real_failing_script_gets_its_cause_kind_and_hint(tmp_path, script, kind, message, hint):
    code, lines = run(script, tmp_path, timeout=60)
    assert code != 0, lines
    job = JobEnd(state="failed", reason=f"worker 0 on host-a exited with code {code}", strategy="mirrored")

    verdict = classify(job, [task_end(code, lines)])

    assert (verdict["kind"], verdict["task"], verdict["task_id"]) == (kind, "worker 0 on host-a", 100), verdict
    assert message in verdict["message"], verdict["message"]
    assert hint in verdict["hint"], verdict["hint"]
    assert 0 < len(verdict["evidence"]) <= 12
    assert verdict["peers"] == []


def test_the_cause_is_the_earliest_own_failure_and_the_others_are_its_peers(tmp_path):
    code, lines = run("user_exception.py", tmp_path)
    # A peer's gRPC error, as a MultiWorkerMirrored survivor prints it (test_jobs_e2e.py runs the real pair); it
    # finished first, yet it is a consequence.
    peer_lines = [
        "Traceback (most recent call last):",
        '  File "/home/u/train.py", line 40, in <module>',
        "tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: ...",
    ]
    tasks = [
        task_end(1, peer_lines, label="worker 0 on host-a", index=0, after_s=0),
        task_end(code, lines, label="worker 1 on host-b", index=1, after_s=2),
        task_end(-9, [], label="worker 2 on host-c", index=2, state="killed", after_s=3, detail="job failed"),
    ]
    verdict = classify(JobEnd("failed", "worker 1 on host-b exited with code 1", "multi_worker_mirrored"), tasks)

    assert (verdict["kind"], verdict["task"]) == ("user_exception", "worker 1 on host-b")
    assert verdict["peers"] == [
        {
            "task": "worker 0 on host-a",
            "task_id": 100,
            "kind": "peer_failure",
            "message": "UnavailableError: Collective ops is aborted by: ... (exit code 1)",
        },
        {
            "task": "worker 2 on host-c",
            "task_id": 102,
            "kind": "stopped",
            "message": "stopped by the product after the job's end (job failed)",
        },
    ]
