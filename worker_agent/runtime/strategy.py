"""Which tf.distribute strategy a task runs, read from TF_CONFIG, and building it through TensorFlow's resolver.

`read_role` is plain JSON (no TensorFlow) so a task that cannot run is refused before the TensorFlow import:
- no TF_CONFIG: MirroredStrategy over this machine's logical GPUs, else its logical CPU devices;
- a cluster with `ps`: ParameterServerStrategy; the chief coordinates, workers and ps tasks only serve;
- any other cluster: MultiWorkerMirroredStrategy over chief + workers (worker 0 is the chief when there is none).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.run_config import ConfigError
from contracts.strategies import ROLE_ORDER, STRATEGY_LABELS, Strategy, is_chief

# No collective timeout (`CommunicationOptions(timeout_seconds=...)`): TensorFlow arms it with one detached thread per
# collective op, which sleeps for the whole timeout (base_collective_executor.cc -> Env::SchedClosureAfter). With 300 s,
# a digits_mlp worker held ~9,000 threads after 600 steps, 13,500 after 40 s of training; two workers exhausted the
# machine's pid_max (32768): "terminate ... std::system_error: Resource temporarily unavailable" (SIGABRT), and every
# other process on the machine failed to fork meanwhile. A dead peer is still noticed in seconds (UnavailableError); a
# frozen one is not, and needs a watchdog outside TensorFlow.


@dataclass(frozen=True)
class Role:
    kind: Strategy
    task_type: str  # "chief" | "worker" | "ps"; "chief" for a mirrored run (its only process)
    task_index: int
    workers: int  # machines that compute: 1 (mirrored), chief + workers (MWMS), workers (PS)
    is_chief: bool  # writes checkpoints and the final model
    cluster: dict[str, list[str]] = field(default_factory=dict)

    @property
    def serves_only(self) -> bool:
        """A ParameterServer worker or ps task: it hosts a server and the chief drives it."""
        return self.kind == Strategy.PARAMETER_SERVER and self.task_type in ("worker", "ps")

    @property
    def name(self) -> str:
        return f"{self.task_type}-{self.task_index}"


def read_role(environ: Mapping[str, str] = os.environ) -> Role:
    raw = environ.get("TF_CONFIG", "").strip()
    if not raw:
        return Role(kind=Strategy.MIRRORED, task_type="chief", task_index=0, workers=1, is_chief=True)
    try:
        tf_config = json.loads(raw)
        cluster = {str(k): [str(a) for a in v] for k, v in tf_config.get("cluster", {}).items()}
        task = tf_config.get("task", {})
        task_type = str(task["type"])
        task_index = int(task.get("index", 0))
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"TF_CONFIG is malformed: {exc!r}") from None
    if task_type not in cluster or not 0 <= task_index < len(cluster[task_type]):
        raise ConfigError(f"TF_CONFIG task {task_type}:{task_index} is not in its cluster {sorted(cluster)}")
    if task_type not in ROLE_ORDER:
        raise ConfigError(f"builtin programs do not run {task_type!r} tasks (only chief, worker and ps)")
    if cluster.get("ps"):
        if len(cluster.get("chief", [])) != 1 or not cluster.get("worker"):
            raise ConfigError("a ParameterServer cluster needs exactly one chief and at least one worker")
        return Role(
            kind=Strategy.PARAMETER_SERVER,
            task_type=task_type,
            task_index=task_index,
            workers=len(cluster["worker"]),
            is_chief=is_chief(task_type, task_index, cluster_has_chief=True),
            cluster=cluster,
        )
    has_chief = bool(cluster.get("chief"))
    return Role(
        kind=Strategy.MULTI_WORKER_MIRRORED,
        task_type=task_type,
        task_index=task_index,
        workers=len(cluster.get("chief", [])) + len(cluster.get("worker", [])),
        is_chief=is_chief(task_type, task_index, cluster_has_chief=has_chief),
        cluster=cluster,
    )


def build_strategy(role: Role, tf: Any) -> Any:
    """The strategy for a computing task (not for a serving one: see `serve`)."""
    if role.kind == Strategy.MIRRORED:
        devices = [d.name for d in tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if role.kind == Strategy.MULTI_WORKER_MIRRORED:
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    # Small models stay whole; a large one is split over the ps tasks in shards of at least 256 KiB.
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=max(len(role.cluster.get("ps", [])), 1)
    )
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


def serve(tf: Any) -> None:
    """A ParameterServer worker or ps task: host this task's server until killed (it never returns)."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()


def strategy_name(role: Role) -> str:
    return STRATEGY_LABELS[role.kind]
