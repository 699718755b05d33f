"""Jobs and their tasks (one OS process per TF_CONFIG task and attempt): their states, fields and task log lines.
Beside them in orchestrator/models/: uploaded scripts (scripts.py), metric points and their rollups (points.py), the
files tasks produce (artifacts.py) and ports found taken (port_blocks.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse

from contracts import strategies
from orchestrator.core import job_states, restarts
from orchestrator.models.clusters import Cluster, Host
from orchestrator.models.scripts import Script

# Django's choices for the names defined once in contracts/strategies.py.
Strategy = models.TextChoices(  # type: ignore[misc]
    "Strategy", [(s.name, (s.value, strategies.STRATEGY_LABELS[s])) for s in strategies.Strategy]
)


class JobState(models.TextChoices):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    # A retryable failure stopped the gang; it is placed again (attempt + 1) once its processes are gone, and
    # resumes from the job's last checkpoint.
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Its time limit came: its tasks got SIGTERM, the cluster's grace period, then SIGKILL (orchestrator/jobs/
    # time_limits.py, the watchdog). Final.
    TIMED_OUT = "timed_out", "timed out"
    # A job of a higher priority class (or a user reclaiming quota) needed its devices: its gang is being stopped and
    # it goes back to the queue with its place kept, to resume from its checkpoint
    # (orchestrator/scheduler/preemption.py). Not a failure: it uses up no restart.
    PREEMPTED = "preempted"


# The final states, defined once in orchestrator/core/job_states.py (plain Python reads them there); each must be one of
# these states (a name that is not raises here, at import).
TERMINAL_JOB_STATES = tuple(JobState(state) for state in job_states.TERMINAL_JOB_STATES)


# Which failures a job is restarted after (up to `max_restarts`): orchestrator/core/restarts.py.
RestartPolicy = models.TextChoices(  # type: ignore[misc]
    "RestartPolicy", [(value.upper(), (value, label)) for value, label in restarts.POLICIES]
)


class ProgramKind(models.TextChoices):
    SCRIPT = "script", "uploaded script"
    BUILTIN = "builtin", "built-in program"


class JobQuerySet(models.QuerySet["Job"]):
    def visible_to(self, user: Any) -> JobQuerySet:
        """Who may see a job, the one rule: its owner and staff. Anyone else finds nothing (pages and the API answer
        404, as if the job did not exist); an anonymous user sees no job at all."""
        if user is None or not user.is_authenticated:
            return self.none()
        jobs = self.select_related("owner", "cluster", "script", "failed_task", "failed_task__host", "priority_class")
        return jobs if user.is_staff else jobs.filter(owner=user)


class Job(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    strategy = models.CharField(max_length=32, choices=Strategy.choices)

    program_kind = models.CharField(max_length=16, choices=ProgramKind.choices)
    script = models.ForeignKey(Script, on_delete=models.PROTECT, null=True, blank=True, related_name="jobs")
    builtin = models.CharField(max_length=64, blank=True)
    builtin_config = models.JSONField(default=dict, blank=True)
    args = models.JSONField(default=list, blank=True, help_text="command-line arguments passed to the program")
    env = models.JSONField(
        default=dict, blank=True, help_text="the job's own environment variables, name -> value (contracts/job_env.py)"
    )
    # Its task environment's name (orchestrator/models/environments.py), set at submission (the cluster's default when
    # it names none); "": the agents' own interpreter. A name, not a key: an environment deleted or renamed leaves the
    # job naming what it ran in, and a waiting job naming one no host has any longer is told so.
    environment = models.CharField(max_length=63, blank=True)
    # A requirements file (contracts/environments.py): its tasks run in a venv built from it on top of the environment.
    requirements = models.TextField(blank=True)

    workers = models.PositiveIntegerField(default=1)
    ps = models.PositiveIntegerField("parameter servers", default=0)
    devices_per_worker = models.PositiveIntegerField(default=1)
    labels = models.CharField(max_length=500, blank=True, help_text="place only on hosts with all these labels")
    max_restarts = models.PositiveIntegerField(default=0)
    restart_policy = models.CharField(max_length=16, choices=RestartPolicy.choices, default=RestartPolicy.EXIT_CODE)
    restarts = models.PositiveIntegerField(default=0, help_text="restarts so far (whole gang or one task in place)")
    restart_reason = models.TextField(blank=True, help_text="what the latest restart was after")
    progress_timeout_s = models.PositiveIntegerField(
        default=600, help_text="a running job with no new metric point or log line for this long is hung (0: off)"
    )
    # Hang detection: the newest metric point and log line ids seen, and when they last changed (orchestrator clock).
    progress_mark = models.CharField(max_length=64, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)
    legacy_keras = models.BooleanField(
        default=True, help_text="TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras, whose fit works with every strategy"
    )
    startup_deadline_s = models.PositiveIntegerField(default=120)
    # Scheduling (orchestrator/scheduler/scheduling.py). The limit is set at submission (the cluster's default when none
    # is given) and counts from each placement: backfill reserves from running gangs' placements plus their limits.
    time_limit_s = models.PositiveIntegerField(
        default=86_400, help_text="its run (each placement) is stopped after this long: state timed out"
    )
    priority_class = models.ForeignKey(
        "orchestrator.PriorityClass", on_delete=models.PROTECT, null=True, blank=True, related_name="jobs"
    )
    held = models.BooleanField(default=False, help_text="staff hold: it waits, keeping its place, until released")
    expected_start = models.DateTimeField(
        null=True, blank=True, help_text="while waiting: the latest it starts, from running jobs' time limits"
    )
    # The head of the queue's reservation: {"at": ISO time, "hosts": {host name: [device, ...]}}; {} for none.
    reservation = models.JSONField(default=dict, blank=True)
    first_reservation_at = models.DateTimeField(null=True, blank=True, help_text="when it was first promised to start")
    preemptions = models.PositiveIntegerField(default=0)
    # Preempted as often as its class bounds within its window: never chosen as a victim again until it ends.
    preemption_shielded = models.BooleanField(default=False)
    # Started beyond its owner's quota (on idle devices): a user under quota may reclaim them by preemption.
    borrowing = models.BooleanField(default=False)
    # Its place in its cluster's pool of task uids (orchestrator/scheduler/task_uids.py): every host runs its tasks as
    # the same uid (--task-uids' first + this), and no other job of the cluster has it while a task of this one is
    # active. Given at placement; None before, or after another job took it once this one had no active task.
    task_uid_slot = models.PositiveIntegerField(null=True, blank=True)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    reason = models.TextField(blank=True, help_text="why the job is in its state (waiting, failed, ...)")
    # The final state the job's success rule decided while other tasks of it were still active: the job takes it
    # once every task has ended (orchestrator/jobs/lifecycle.py), so a final job never has a live task. Empty: not
    # ending.
    ending = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    ending_at = models.DateTimeField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0, help_text="placements so far; tasks carry the one they belong to")
    facts = models.JSONField(
        default=dict,
        blank=True,
        help_text="what the chief (or worker 0) reported: replicas, batch sizes, learning rate",
    )
    # Per-job limits (orchestrator/limits.py): points stored and left out by the ingest, artifacts refused and why.
    points_stored = models.PositiveBigIntegerField(default=0)
    points_thinned = models.PositiveBigIntegerField(default=0)
    # The last metric point sequence number given out (contracts/protocol.py POINT_SEQ): a job's points are numbered
    # 1, 2, ... in the order their transactions commit, whichever ingest partition stored them.
    points_seq = models.PositiveBigIntegerField(default=0)
    # Every point numbered up to this is in the job's rollups (PointRollup, orchestrator/metrics/rollups.py).
    points_rolled = models.PositiveBigIntegerField(default=0)
    artifacts_refused = models.PositiveIntegerField(default=0)
    artifact_refusal = models.TextField(blank=True, help_text="why the latest artifact was refused")
    # The task whose end failed the job; its log tail is read at display time, so late log lines still show.
    failed_task = models.ForeignKey("Task", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Why it ended so (orchestrator/diagnosis/): the cause task, the kind, one sentence, a hint, evidence lines and
    # the peers that failed because of it. {} until a failed, timed out or hung job is diagnosed.
    diagnosis = models.JSONField(default=dict, blank=True)
    # Where its run is (orchestrator/metrics/progress.py): epoch k of N, examples/s, ETA; {} before its first epoch.
    progress = models.JSONField(default=dict, blank=True)
    # What its workers' measurements say (issue 45): input-bound share per worker, the slow worker; {} for none.
    insights = models.JSONField(default=dict, blank=True)
    # Its preflight (orchestrator/preflight/): {"state": "running" | "passed" | "failed", "job": id, ...}; {} for
    # none. `preflight_for`: on a preflight run, the job it checks.
    preflight = models.JSONField(default=dict, blank=True)
    preflight_for = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="preflights"
    )
    # A run of a compare-strategies experiment (orchestrator/experiments/actions.py), and which of its variants.
    experiment = models.ForeignKey(
        "orchestrator.Experiment", on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs"
    )
    variant = models.CharField(max_length=100, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "state", "created_at"]),
            # The jobs list (newest first, a page of them): an index scan instead of sorting every job ever run.
            models.Index(fields=["-created_at", "-id"], name="job_newest_first"),
        ]
        constraints = [
            # Never two runs of one variant of an experiment, whatever races (orchestrator/experiments/actions.py).
            models.UniqueConstraint(
                fields=["experiment", "variant"],
                condition=models.Q(experiment__isnull=False),
                name="one_job_per_experiment_variant",
            ),
            # One job per uid slot of a cluster, whatever races (orchestrator/scheduler/task_uids.py).
            models.UniqueConstraint(
                fields=["cluster", "task_uid_slot"],
                condition=models.Q(task_uid_slot__isnull=False),
                name="one_job_per_task_uid_slot",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("dashboard:job", args=[self.pk])

    def points_shed(self) -> int:
        """Step-level points the agents left out of this job's reports, every attempt (Task.points_shed)."""
        return self.tasks.aggregate(shed=models.Sum("points_shed"))["shed"] or 0

    @property
    def priority(self) -> str:
        """The priority class's name, as the job's fields name it (orchestrator/submit/job_fields.py)."""
        return self.priority_class.name if self.priority_class_id else ""

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_JOB_STATES

    def current_tasks(self) -> models.QuerySet[Task]:
        return self.tasks.filter(attempt=self.attempt).select_related("host")


TaskType = models.TextChoices("TaskType", [(t.name, t.value) for t in strategies.TaskType])  # type: ignore[misc]


class TaskState(models.TextChoices):
    PENDING = "pending"  # placed, launch order sent
    STARTING = "starting"  # the process runs; its TF server is not listening yet
    RUNNING = "running"
    STOPPING = "stopping"  # a kill order was sent
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"


# A task in one of these holds its port and devices.
ACTIVE_TASK_STATES = (TaskState.PENDING, TaskState.STARTING, TaskState.RUNNING, TaskState.STOPPING)


class Task(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tasks")
    attempt = models.PositiveIntegerField(default=1)
    type = models.CharField(max_length=16, choices=TaskType.choices)
    index = models.PositiveIntegerField()
    host = models.ForeignKey(Host, on_delete=models.SET_NULL, null=True, blank=True, related_name="tasks")
    port = models.PositiveIntegerField(null=True, blank=True)
    devices = models.JSONField(default=list, blank=True)
    tf_config = models.JSONField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=TaskState.choices, default=TaskState.PENDING)
    pid = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    detail = models.TextField(blank=True)
    facts = models.JSONField(default=dict, blank=True)
    # The sealed time (its agent's clock) of the report `facts` came from: an older one, late or replayed, is refused.
    facts_at = models.FloatField(null=True, blank=True)
    # When the scheduler placed it (its devices are held from then on: usage counts from here, orchestrator/usage/).
    # Null on rows placed before usage was recorded.
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    listening_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Its device-seconds are in the usage rollup (orchestrator/usage/recording.py): set in the transaction that ended
    # it, so an end delivered twice counts once.
    usage_recorded = models.BooleanField(default=False)
    # A ParameterServer worker restarted in place is a new row (so agents, logs and metrics tell the runs apart) with
    # the same type, index, host, port and TF_CONFIG, and the next `restart` number.
    restart = models.PositiveIntegerField(default=0)
    # How many times this slot's process was started again: the gang restarts it took part in plus its in-place
    # relaunches (a re-placement after a port conflict is neither).
    restarts = models.PositiveIntegerField(default=0)
    # The number (the agent's event clock) of the newest event applied to this task: an event not newer is a
    # replay; a heartbeat written after it that lists the task nowhere means its process is gone.
    event_seq = models.BigIntegerField(default=0)
    # When the latest launch or kill order for it went out: an order nobody acted on is sent again after a while.
    ordered_at = models.DateTimeField(null=True, blank=True)
    # Output stored so far (orchestrator/limits.line_bytes) and whether the log limit cut it (one marker line then).
    log_bytes = models.PositiveBigIntegerField(default=0)
    log_truncated = models.BooleanField(default=False)
    # Lines of this attempt taken in so far (the highest seq + 1, a line cut by the log limit counted too); an exit
    # that says its task printed more waits in `exit_waiting` (its EXITED event) until they are in.
    log_lines_in = models.PositiveBigIntegerField(default=0)
    exit_waiting = models.JSONField(null=True, blank=True)
    # Step-level points its agent left out while the ingest was behind (contracts/protocol.py SHED_BACKLOG): the
    # highest running total its reports carried.
    points_shed = models.PositiveBigIntegerField(default=0)
    # What its agent dropped of this task's output for the per-task bounds (contracts/publish_limits.py): the highest
    # running totals its reports carried (orchestrator/metrics/drops.py).
    artifacts_dropped = models.PositiveBigIntegerField(default=0)
    artifact_bytes_dropped = models.PositiveBigIntegerField(default=0)
    log_lines_dropped = models.PositiveBigIntegerField(default=0)
    metric_lines_dropped = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["job", "attempt", "type", "index", "restart"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "type", "index", "restart"], name="task_unique_in_job_attempt"
            )
        ]
        indexes = [
            models.Index(fields=["host", "state"]),
            # The tasks whose usage is not recorded yet: those still holding devices (every ended task is recorded, or
            # marked so by the migration that began recording). The usage reads find them here, not in every task.
            models.Index(fields=["id"], condition=models.Q(usage_recorded=False), name="task_usage_pending"),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.index}" + (f" (restart {self.restart})" if self.restart else "")

    @property
    def live_pid(self) -> int | None:
        """The process id while the task is active; a final task's pid names no process any more (or someone else's)."""
        return self.pid if self.state in ACTIVE_TASK_STATES else None

    @property
    def label(self) -> str:
        where = f" on {self.host.name}" if self.host_id else ""
        return f"{self}{where}"

    def log_tail(self, lines: int = 30) -> list[TaskLogLine]:
        """The last lines of the task's error output (where a traceback goes), or of all output when it wrote no
        stderr. stdout and stderr are separate files read apart, so their interleaving is only
        approximate: a tail of one stream keeps a traceback whole and in order."""
        stderr = list(reversed(self.log_lines.filter(stream="stderr").order_by("-seq")[:lines]))
        return stderr or list(reversed(self.log_lines.order_by("-seq")[:lines]))


class TaskLogLine(models.Model):
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="log_lines")
    seq = models.PositiveIntegerField()
    stream = models.CharField(max_length=6)  # stdout | stderr
    text = models.TextField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task", "seq"]
        # The agent numbers lines; a redelivered batch is stored once.
        constraints = [models.UniqueConstraint(fields=["task", "seq"], name="log_line_unique")]

    def __str__(self) -> str:
        return f"{self.task_id}#{self.seq}"
