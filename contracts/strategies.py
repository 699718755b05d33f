"""Strategies, task types and TensorFlow's TF_CONFIG rules: who runs as which process, who listens on a port, and
which task's exit speaks for the job. The orchestrator (placement, TF_CONFIG, lifecycle) and the runtime (reading its
role from TF_CONFIG) both follow these, so they are written once, here.
"""

from __future__ import annotations

import sys
from enum import Enum

# Part of the runtime set (worker_agent/supervision/runtime_root.py): it runs in a task environment's interpreter,
# Python 3.9 at the oldest, where enum has no StrEnum yet.
if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, Enum):
        """enum.StrEnum as Python 3.11 has it: members are their values, also in str() and format()."""

        def __str__(self) -> str:
            return str(self.value)


class Strategy(StrEnum):
    MIRRORED = "mirrored"
    MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
    PARAMETER_SERVER = "parameter_server"


# What people know them as: TensorFlow's class names.
STRATEGY_LABELS: dict[Strategy, str] = {
    Strategy.MIRRORED: "MirroredStrategy",
    Strategy.MULTI_WORKER_MIRRORED: "MultiWorkerMirroredStrategy",
    Strategy.PARAMETER_SERVER: "ParameterServerStrategy",
}


# TensorFlow's decision table (the tf.distribute guide), one line per strategy, shown next to the choice.
STRATEGY_HINTS: dict[str, str] = {
    Strategy.MIRRORED: "One machine with several devices: one process, gradients all-reduced across its devices.",
    Strategy.MULTI_WORKER_MIRRORED: (
        "Several machines, alike, on a fast interconnect: synchronous all-reduce; every step waits for the slowest."
    ),
    Strategy.PARAMETER_SERVER: (
        "Many or unlike workers, stragglers, asynchronous updates acceptable: a chief coordinates, ps tasks hold the "
        "variables, workers never wait for each other."
    ),
}


class TaskType(StrEnum):
    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"
    EVALUATOR = "evaluator"


# The order of a TF_CONFIG `cluster`'s roles, and of a job's tasks wherever they are listed.
ROLE_ORDER: tuple[str, ...] = (TaskType.CHIEF, TaskType.WORKER, TaskType.PS)


def is_single_process(strategy: str) -> bool:
    """MirroredStrategy runs one process on one machine: it needs no TF_CONFIG, opens no TF server and so holds no
    port; every other strategy's tasks each listen on one."""
    return Strategy(strategy) is Strategy.MIRRORED


def has_chief_task(strategy: str) -> bool:
    """Whether the product gives a job of this strategy a `chief` task: only ParameterServer (its coordinator)."""
    return Strategy(strategy) is Strategy.PARAMETER_SERVER


def is_chief(task_type: str, task_index: int, *, cluster_has_chief: bool) -> bool:
    """TensorFlow's rule: the `chief` task is the chief; a cluster without one makes worker 0 the chief. The chief
    writes checkpoints and the saved model, and its exit speaks for the job."""
    if cluster_has_chief:
        return task_type == TaskType.CHIEF
    return task_type == TaskType.WORKER and task_index == 0


def speaks_for_job(strategy: str) -> tuple[str, int]:
    """The task whose exit decides a job of this strategy (and whose facts are the job's): its chief."""
    return (TaskType.CHIEF, 0) if has_chief_task(strategy) else (TaskType.WORKER, 0)


def serves_only(strategy: str, task_type: str) -> bool:
    """A ParameterServer worker or ps task: it runs `tf.distribute.Server(...).join()` while the chief drives it, so
    it never exits by itself."""
    return Strategy(strategy) is Strategy.PARAMETER_SERVER and task_type in (TaskType.WORKER, TaskType.PS)
