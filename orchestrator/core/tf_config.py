"""TF_CONFIG and the per-task environment, generated from a `Placement`.

Follows TensorFlow's rules (the same shape Kubeflow's TFJob writes): one `cluster` shared by every task of a
job, and a `task` that names the process's own role and index.
"""

from __future__ import annotations

import json
from typing import Any

from contracts.strategies import ROLE_ORDER, Strategy, is_single_process
from orchestrator.core.assignment import TaskPlacement
from orchestrator.core.placement import Placement


def cluster_spec(placement: Placement) -> dict[str, list[str]]:
    spec: dict[str, list[str]] = {}
    for role in ROLE_ORDER:
        tasks = sorted((t for t in placement.tasks if t.type == role), key=lambda t: t.index)
        if not tasks:
            continue
        if [t.index for t in tasks] != list(range(len(tasks))):
            # TF reads a role's list positionally: a gap or duplicate would silently rename tasks.
            raise ValueError(f"{role} indexes must be 0..{len(tasks) - 1}, got {[t.index for t in tasks]}")
        spec[role] = [_endpoint(t) for t in tasks]
    unknown = {t.type for t in placement.tasks} - set(ROLE_ORDER)
    if unknown:
        raise ValueError(f"unknown task types: {', '.join(sorted(unknown))}")
    return spec


def tf_config_for(placement: Placement, task: TaskPlacement, strategy: Strategy) -> dict[str, Any] | None:
    if task not in placement.tasks:
        raise ValueError(f"{task.type} {task.index} is not part of this placement")
    return tf_configs_for(placement, strategy)[(task.type, task.index)]


def tf_configs_for(placement: Placement, strategy: Strategy) -> dict[tuple[str, int], dict[str, Any] | None]:
    """Every task's TF_CONFIG, by (type, index). The cluster is built once and shared: per task it was O(tasks²) for
    a job, and a 64-worker job was most of a scheduler pass."""
    if is_single_process(strategy):
        return {(t.type, t.index): None for t in placement.tasks}
    spec = cluster_spec(placement)
    return {(t.type, t.index): {"cluster": spec, "task": {"type": t.type, "index": t.index}} for t in placement.tasks}


def tf_config_texts(placement: Placement, strategy: Strategy) -> dict[tuple[str, int], str | None]:
    """Every task's TF_CONFIG as JSON text, by (type, index): what `tf_configs_for` gives, with the shared cluster
    serialized once for the job (a 64-worker job's 64 TF_CONFIGs each list all 64 addresses: encoding each whole was
    most of what a pass spent writing task rows)."""
    if is_single_process(strategy):
        return {(t.type, t.index): None for t in placement.tasks}
    cluster = json.dumps(cluster_spec(placement))
    texts: dict[tuple[str, int], str | None] = {}
    for t in placement.tasks:
        texts[(t.type, t.index)] = (
            f'{{"cluster": {cluster}, "task": {{"type": {json.dumps(t.type)}, "index": {t.index:d}}}}}'
        )
    return texts


def task_port(task: TaskPlacement, strategy: Strategy) -> int | None:
    """The port the task listens on; None for a single-process (Mirrored) run, which opens no TF server and so holds
    no port even though placement reserved one while it placed the job."""
    return None if is_single_process(strategy) else task.port


def task_environment(
    placement: Placement, task: TaskPlacement, strategy: Strategy, *, legacy_keras: bool = True
) -> dict[str, str]:
    """Variables the agent adds to one task's environment.

    CUDA_VISIBLE_DEVICES is left to the agent: it knows if `task.devices` are GPUs or logical CPU devices.
    """
    return environment(tf_config_for(placement, task, strategy), strategy, legacy_keras=legacy_keras)


def environment(config: dict[str, Any] | None, strategy: Strategy, *, legacy_keras: bool = True) -> dict[str, str]:
    """The variables for a task whose TF_CONFIG is `config` (also used to relaunch a task in place)."""
    env: dict[str, str] = {}
    if config is not None:
        env["TF_CONFIG"] = json.dumps(config)
    if Strategy(strategy) is Strategy.PARAMETER_SERVER:
        # Lets the coordinator see a lost worker or ps as an error instead of waiting on gRPC retries forever.
        env["GRPC_FAIL_FAST"] = "use_caller"
    if legacy_keras:
        # MWMS and PS `model.fit` only work with tf_keras (TF_NOTES.md).
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def _endpoint(task: TaskPlacement) -> str:
    host = f"[{task.address}]" if ":" in task.address else task.address
    return f"{host}:{task.port}"
