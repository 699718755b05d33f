"""Orders to agents: one Celery message per task on the host's own queue, carrying ids and a small spec, signed with
the control plane's Ed25519 key (contracts/signing.py), which the agent pins: nothing in the database or on the
broker is enough to sign one. Each order has an id of its own and is fresh for a minute (signing.ORDER_MAX_AGE_S);
a resend is a new order.

Every order may be lost or delivered twice: each stamps `Task.ordered_at`, and the heartbeat's convergence
(orchestrator/agents/reconcile.py) sends it again when the agent's report shows it was not acted on; the agent
applies a launch once per (task, attempt) however often it arrives."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from django.db import transaction
from django.utils import timezone

from contracts.protocol import AGENT_ACK_EXITS, AGENT_KILL, AGENT_LAUNCH, SCHEDULER_QUEUE, agent_queue
from contracts.run_config import script_env
from contracts.signing import WIRE_VERSION, sign_order
from contracts.strategies import Strategy
from contracts.task_messages import KillOrder, LaunchSpec, ProgramSpec, launch_body_for
from contracts.task_wire import PREFLIGHT_STEPS_ENV
from orchestrator.core import tf_config
from orchestrator.identity.keys import control_private_key
from orchestrator.models import Host, Job, ProgramKind, Task, TaskEnvironment, TaskState
from orchestrator.models.row_locks import lock_tasks
from orchestrator.objectstore import store as storage
from orchestrator.plumbing import broker_sends
from orchestrator.plumbing.broker_sends import BROKER_ERRORS
from orchestrator.plumbing.celery_app import app

log = logging.getLogger(__name__)

# Launch orders of a scheduler pass are sent by a task of their own (by name: orchestrator/tasks.py imports this
# module, not the other way round), in chunks: the pass ends as soon as its placements are committed and each message
# stays small. On the scheduler's queue, not the orchestrator's: at fleet size the hosts' task events back up there (a
# slow two-core machine's 2,500-job scale bench had launch orders reach the agents 18.9 s after placement, p50), and a
# launch queued behind them kept devices booked and idle, then had the heartbeats' convergence send it again. The
# scheduler's worker is idle between passes.
LAUNCH = "orchestrator.launch"
LAUNCH_CHUNK = 200


def program_spec(job: Job) -> ProgramSpec:
    if job.program_kind == ProgramKind.SCRIPT:
        assert job.script is not None
        return ProgramSpec(
            kind="script",
            args=list(job.args),
            script_sha256=job.script.sha256,
            script_b64=base64.b64encode(bytes(job.script.content)).decode("ascii"),
        )
    return ProgramSpec(kind="builtin", args=list(job.args), builtin=job.builtin, builtin_config=job.builtin_config)


def launch_spec(
    task: Task,
    env: dict[str, str],
    program: ProgramSpec | None = None,
    store: dict[str, Any] | None = None,
    interpreter: str | None = None,
) -> LaunchSpec:
    """`interpreter`: the job's environment's (looked up when not given)."""
    assert task.host is not None
    if interpreter is None:
        interpreter = environment_interpreter(task.job)
    return LaunchSpec(
        job_id=task.job_id,
        task_id=task.pk,
        attempt=task.attempt,
        task_type=task.type,
        task_index=task.index,
        port=task.port,
        devices=list(task.devices),
        gpu=bool(task.host.gpus),
        env=env,
        program=program or program_spec(task.job),
        kill_grace_s=float(task.job.cluster.stop_grace_s),  # SIGTERM, then SIGKILL after it (limits, preemption)
        job_dir=job_dir(task.job),
        user_env=dict(task.job.env or {}),
        store=store or {},
        uid_slot=task.job.task_uid_slot,  # the job's uid on every host (orchestrator/scheduler/task_uids.py)
        environment=task.job.environment,
        interpreter=interpreter,
        requirements=task.job.requirements,
    )


def environment_interpreter(job: Job) -> str:
    """The interpreter of the job's task environment as registered now ("" for the agents' own). One deleted since
    the job was placed is "" too, with the environment named: the agent refuses such a launch (the task fails
    saying the environment is gone) rather than run it in its own interpreter."""
    if not job.environment:
        return ""
    found = TaskEnvironment.objects.filter(cluster_id=job.cluster_id, name=job.environment)
    return found.values_list("interpreter", flat=True).first() or ""


def launch_body(spec: LaunchSpec) -> dict[str, Any]:
    """The order's body. `user_env` goes only when the job sets variables: an agent from before it (which refuses an
    unknown key) still runs every job that sets none while a fleet is upgraded; `store` likewise goes only on a cluster
    with an object store; `uid_slot` only once the job has one (a task placed before the upgrade has none)."""
    body = asdict(spec)
    for optional in ("user_env", "store", "environment", "interpreter", "requirements"):
        if not body[optional]:
            del body[optional]
    if body["uid_slot"] is None:
        del body["uid_slot"]
    return body


def job_dir(job: Job) -> str:
    """The job's folder on every host when the cluster has a shared one; else the agent picks a local folder."""
    shared = job.cluster.shared_dir.rstrip("/")
    return f"{shared}/jobs/{job.pk}" if shared else ""


def launch_after_commit(task_ids: list[int]) -> None:
    """Have these tasks' launch orders sent once the current transaction commits. A message lost on the way costs a
    delay, not the launch: the tasks are stamped as ordered, and the heartbeat's convergence sends what was not acted
    on after `TFDASH_ORDER_RESEND_S`."""

    def send() -> None:
        for start in range(0, len(task_ids), LAUNCH_CHUNK):
            chunk = task_ids[start : start + LAUNCH_CHUNK]
            try:
                broker_sends.send(LAUNCH, [chunk], SCHEDULER_QUEUE)
            except BROKER_ERRORS as exc:
                log.warning("could not ask for %s launch orders (convergence sends them): %r", len(chunk), exc)

    transaction.on_commit(send)


def launch_tasks(task_ids: list[int]) -> None:
    """Send each task's launch order (again, when an earlier one went unanswered: the agent applies it once)."""
    tasks = list(
        # Only pending ones: a task stopped meanwhile must not be started by a late resend.
        Task.objects.filter(pk__in=task_ids, state=TaskState.PENDING).select_related(
            "host", "job", "job__script", "job__cluster"
        )
    )
    _stamp(tasks)
    programs: dict[int, ProgramSpec] = {}  # per job: a script's base64 is made once, not once per task
    interpreters: dict[int, str] = {}  # per job, looked up once
    stores = _Stores()
    # One broker connection for the whole batch, not one acquired per order, and its orders sent in one pipeline.
    with _producer() as producer, _batched(producer):
        for task in tasks:
            job = task.job
            env = tf_config.environment(task.tf_config, Strategy(job.strategy), legacy_keras=job.legacy_keras)
            if job.program_kind == ProgramKind.SCRIPT:
                env.update(script_env(job.builtin_config or {}))  # a builtin gets it in TFDASH_PROGRAM_CONFIG
            if job.preflight_for_id and isinstance(steps := (job.preflight or {}).get("steps"), int):
                env[PREFLIGHT_STEPS_ENV] = str(steps)  # the runtime stops fit after them (orchestrator/preflight/)
            if job.pk not in programs:
                programs[job.pk] = program_spec(job)
            if job.pk not in interpreters:
                interpreters[job.pk] = environment_interpreter(job)
            spec = launch_spec(task, env, programs[job.pk], stores.urls(task), interpreters[job.pk])
            _send(AGENT_LAUNCH, launch_body(spec), task.host, producer)


class _Stores:
    """Presigned URLs for the tasks of one batch of orders: one S3 client per cluster, one chief check per job."""

    def __init__(self) -> None:
        self._clients: dict[int, Any] = {}
        self._chief: dict[int, bool] = {}

    def urls(self, task: Task) -> dict[str, Any]:
        cluster = task.job.cluster
        if not cluster.has_store:
            return {}
        try:
            if cluster.pk not in self._clients:
                self._clients[cluster.pk] = storage.client(cluster)
        except storage.StoreUnavailable as exc:
            # Launched without: it starts from scratch rather than not at all; staff see why in the log.
            log.error("cluster %s: object store unusable, task %s launched without it: %s", cluster.pk, task.pk, exc)
            return {}
        if task.job_id not in self._chief:
            self._chief[task.job_id] = Task.objects.filter(job_id=task.job_id, type="chief").exists()
        return storage.task_urls(self._clients[cluster.pk], task, self._chief[task.job_id])


def kill_tasks(tasks: list[Task], reason: str, *, stamp: bool = True) -> None:
    """Kill orders to each task's host. `stamp` False: a kill that is no order about the task's row (a stray process
    a host reports), so its `ordered_at` stays as it was."""
    tasks = [task for task in tasks if task.host is not None]
    if stamp:
        _stamp(tasks)
    for task in tasks:
        order = KillOrder(job_id=task.job_id, task_id=task.pk, attempt=task.attempt, reason=reason)
        _send(AGENT_KILL, asdict(order), task.host)


def acknowledge_exits(host: Host, keys: list[tuple[int, int]]) -> None:
    """Tell the agent these exits are stored, so its heartbeat stops carrying them."""
    if keys:
        body = {"exits": [list(key) for key in keys]}
        _send(AGENT_ACK_EXITS, body, host)


@contextmanager
def _producer() -> Iterator[Any]:
    """A producer for several orders; None (each send acquires its own) when the broker cannot be reached now."""
    try:
        context = app.producer_or_acquire()
        producer = context.__enter__()
    except BROKER_ERRORS as exc:
        log.warning("no broker connection for a batch of orders (each is tried on its own): %r", exc)
        yield None
        return
    try:
        yield producer
    finally:
        context.__exit__(None, None, None)


@contextmanager
def _batched(producer: Any) -> Iterator[None]:
    """Orders published on `producer` inside the block go to the broker together when it ends (the Redis transport's
    `batched_puts`, kombu_redis/transport.py); one by one where there is no such channel (no producer: the broker was
    away). A batch the broker does not take is logged: its tasks are stamped, so the heartbeat's convergence sends
    their orders again."""
    batched = getattr(getattr(producer, "channel", None), "batched_puts", None)
    if batched is None:
        yield
        return
    try:
        with batched():
            yield
    except BROKER_ERRORS as exc:
        log.warning("could not send a batch of orders (they will be sent again): %r", exc)


def _send(order: str, body: dict[str, Any], host: Host, producer: Any = None) -> None:
    # In the protocol the host's agent speaks (one behind while a fleet is upgraded: docs/upgrade.md), with only the
    # launch-spec keys it knows; a host not heard from yet gets the current protocol.
    protocol = host.agent_protocol or WIRE_VERSION
    if order == AGENT_LAUNCH:
        body = launch_body_for(body, protocol)
    message = sign_order(control_private_key(), host.name, order, body, protocol=protocol)
    try:
        broker_sends.send(order, [message], agent_queue(host.name), producer)
    except BROKER_ERRORS as exc:  # stamped already: the heartbeat's convergence sends it again
        log.warning("could not send %s to %s (it will be sent again): %r", order, host.name, exc)


def _stamp(tasks: list[Task]) -> None:
    # Before sending: an order that is lost after this line is sent again by the heartbeat's convergence. The rows are
    # locked in id order first (orchestrator/models/row_locks.py): a bare UPDATE takes them in the table's order.
    ids = [t.pk for t in tasks]
    with transaction.atomic():
        lock_tasks(ids)
        Task.objects.filter(pk__in=ids).update(ordered_at=timezone.now())
