"""The Django models, one module per concern: clusters and hosts, jobs and tasks with their log lines (jobs.py),
uploaded scripts, metric points and their rollups, artifacts, ports found taken, experiments, the queue's rows
(priority classes, quotas, a job's story), webhooks and their outbox, leases, API tokens, task environments, device
usage per day (usage.py); row_locks.py says the one order in which writers lock job and task rows.

May import: contracts, core (the rules the models' choices and checks are made from). Never a feature package."""

from __future__ import annotations

from orchestrator.models.api_tokens import ApiToken
from orchestrator.models.artifacts import JobArtifact
from orchestrator.models.clusters import Cluster, Host, HostSample, HostStatus
from orchestrator.models.environments import TaskEnvironment
from orchestrator.models.experiments import Experiment, ExperimentMode
from orchestrator.models.jobs import (
    ACTIVE_TASK_STATES,
    TERMINAL_JOB_STATES,
    Job,
    JobState,
    ProgramKind,
    RestartPolicy,
    Strategy,
    Task,
    TaskLogLine,
    TaskState,
    TaskType,
)
from orchestrator.models.leases import ControlLease
from orchestrator.models.points import MetricPoint, PointRollup
from orchestrator.models.port_blocks import HostPortBlock
from orchestrator.models.queueing import DecayedUsage, JobEvent, PriorityClass, Quota
from orchestrator.models.scripts import Script
from orchestrator.models.usage import DeviceKind, UsageDay, device_kind
from orchestrator.models.webhooks import DeliveryState, JobStateChange, Webhook, WebhookDelivery

__all__ = [
    "ACTIVE_TASK_STATES",
    "TERMINAL_JOB_STATES",
    "ApiToken",
    "Cluster",
    "ControlLease",
    "DecayedUsage",
    "DeliveryState",
    "DeviceKind",
    "Experiment",
    "ExperimentMode",
    "Host",
    "HostPortBlock",
    "HostSample",
    "HostStatus",
    "Job",
    "JobArtifact",
    "JobEvent",
    "JobState",
    "JobStateChange",
    "MetricPoint",
    "PointRollup",
    "PriorityClass",
    "ProgramKind",
    "Quota",
    "RestartPolicy",
    "Script",
    "Strategy",
    "Task",
    "TaskEnvironment",
    "TaskLogLine",
    "TaskState",
    "TaskType",
    "UsageDay",
    "Webhook",
    "WebhookDelivery",
    "device_kind",
]
