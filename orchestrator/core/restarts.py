"""Which failures a job is restarted after: plain Python, no Django.

The default follows Kubeflow's `ExitCode` policy: an exit code of 1-127 is the program's own verdict (a bug, a bad
argument) and restarting would fail the same way; 128-255 means killed by a signal (as a shell reports it; Python's
Popen reports -N), which is what preemption, the OOM killer or an operator do; a lost host and a hang are about the
machine, not the program. A launch the agent refused (bad spec) and a start-up deadline are never retried.
"""

from __future__ import annotations

EXIT_CODE = "exit_code"
ON_FAILURE = "on_failure"
NEVER = "never"

# Each policy with what it means to a person (the job form shows these).
POLICIES: tuple[tuple[str, str], ...] = (
    (EXIT_CODE, "by exit code: 1-127 permanent; 128-255, signals, lost hosts and hangs retryable"),
    (ON_FAILURE, "after any failure"),
    (NEVER, "never"),
)


def retryable(policy: str, exit_code: int | None, *, lost: bool = False, hung: bool = False) -> bool:
    if policy == NEVER:
        return False
    if policy == ON_FAILURE:
        return True
    if lost or hung:
        return True
    if exit_code is None:
        return False
    return exit_code < 0 or exit_code >= 128
