"""tfdash's own settings (part of config/settings.py), each from the environment: agent liveness and orders, the
scheduler's policy and pass interval, the single actors' leases, what one user, job or task may hold, retention, the
control key, message and stream ages, the metrics ingest, webhooks, and the periodic tasks that run at these
intervals (CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from config.env import EnvError, env_float, env_int, env_str
from contracts.protocol import WEBHOOKS_QUEUE
from orchestrator.core import preflight, scheduler_policy

# Agent liveness: a host is `offline` once no heartbeat arrived for this long; the watchdog looks this often.
TFDASH_HEARTBEAT_TIMEOUT_S = env_float("TFDASH_HEARTBEAT_TIMEOUT_S", 15.0)
TFDASH_WATCHDOG_INTERVAL_S = env_float("TFDASH_WATCHDOG_INTERVAL_S", 1.0)
# A launch or kill order the agent's reports show was not acted on is sent again after this long (the agent applies
# each launch once, so a resend of one that was merely slow costs nothing).
TFDASH_ORDER_RESEND_S = env_float("TFDASH_ORDER_RESEND_S", 10.0)
# A task's exit waits for the output lines it says the task printed (a final job has its whole log); when they have
# not all come in this long (an agent's outbox dropped some in a long broker outage), it is applied with what is in.
TFDASH_EXIT_LINES_WAIT_S = env_float("TFDASH_EXIT_LINES_WAIT_S", 30.0)

# The scheduler (orchestrator/scheduler/scheduling.py): "backfill" (the default: a reservation for each of the first
# TFDASH_BACKFILL_DEPTH jobs that do not fit, and jobs behind start when they keep clear of them; priorities,
# fair share and preemption) or "fifo" (strict first come, first served, no preemption: bench/scale.py compares).
# The policies are orchestrator/core/scheduler_policy.py's table.
TFDASH_SCHEDULER_POLICY = env_str("TFDASH_SCHEDULER_POLICY", scheduler_policy.DEFAULT_POLICY)
if TFDASH_SCHEDULER_POLICY not in scheduler_policy.POLICIES:
    raise RuntimeError(
        f"TFDASH_SCHEDULER_POLICY must be {' or '.join(scheduler_policy.POLICIES)}, not {TFDASH_SCHEDULER_POLICY!r}"
    )
TFDASH_BACKFILL_DEPTH = env_int("TFDASH_BACKFILL_DEPTH", scheduler_policy.DEFAULT_BACKFILL_DEPTH, minimum=1)
# Scheduler passes over one cluster begin at least this far apart: an ask that comes sooner (a gang ended, a job was
# submitted) is taken by one pass at the end of the interval, with every other ask made meanwhile (Volcano schedules
# every second, Slurm's backfill every 30 s). A pass after a quiet spell begins at once.
TFDASH_SCHEDULE_INTERVAL_S = env_float("TFDASH_SCHEDULE_INTERVAL_S", 3.0)
# A preflight's bounds (orchestrator/core/preflight.py, docs/user-guide/preflight.md): the steps of `fit` it runs, and
# its time limit from its placement (start-up included), the longest it holds its one device.
TFDASH_PREFLIGHT_STEPS = env_int("TFDASH_PREFLIGHT_STEPS", preflight.STEPS, minimum=1)
TFDASH_PREFLIGHT_TIME_LIMIT_S = env_int("TFDASH_PREFLIGHT_TIME_LIMIT_S", preflight.TIME_LIMIT_S, minimum=30)
# Leases of the single actors (orchestrator/leases/: one beat and one scheduler act, however many control planes run),
# Kubernetes' leader-election defaults: a lease lasts 15 s from its last renewal (the database's clock); its holder
# tries to renew every 2 s and stops acting once 10 s passed without a renewal (before anyone can take it over); a
# standby tries every 2 s. A holder that dies is replaced within LEASE + RETRY (17 s); a clean stop hands it over at
# the standby's next try. Shorter leases fail over sooner but take a stall of the holder (a long pause, a slow
# database) for a death.
TFDASH_LEASE_S = env_float("TFDASH_LEASE_S", 15.0)
TFDASH_LEASE_RENEW_DEADLINE_S = env_float("TFDASH_LEASE_RENEW_DEADLINE_S", 10.0)
TFDASH_LEASE_RETRY_S = env_float("TFDASH_LEASE_RETRY_S", 2.0)
if not 0 < TFDASH_LEASE_RETRY_S < TFDASH_LEASE_RENEW_DEADLINE_S < TFDASH_LEASE_S <= 3600:
    raise EnvError(
        "the lease settings must keep 0 < TFDASH_LEASE_RETRY_S < TFDASH_LEASE_RENEW_DEADLINE_S < TFDASH_LEASE_S "
        f"<= 3600 (now {TFDASH_LEASE_RETRY_S}, {TFDASH_LEASE_RENEW_DEADLINE_S}, {TFDASH_LEASE_S})"
    )

# What one user, job or task may hold (orchestrator/limits.py reads them; docs/admin/limits.md lists them). Each is a
# positive number: a deployment that wants more raises it, there is no "unlimited".
# Queued + running (not yet ended) jobs one user may have; a submission past it is refused, staff included.
TFDASH_MAX_ACTIVE_JOBS_PER_USER = env_int("TFDASH_MAX_ACTIVE_JOBS_PER_USER", 20, minimum=1)
# Output one task attempt may store (UTF-8 bytes, a newline per line); later lines are dropped after one marker line.
TFDASH_MAX_LOG_BYTES_PER_TASK = env_int("TFDASH_MAX_LOG_BYTES_PER_TASK", 64 * 1024 * 1024, minimum=1)
# Metric points one job stores in full; past it only every TFDASH_POINTS_THIN_STRIDE-th step (and every epoch_end
# point) is kept, and past twice it nothing more.
TFDASH_MAX_POINTS_PER_JOB = env_int("TFDASH_MAX_POINTS_PER_JOB", 1_000_000, minimum=1)
TFDASH_POINTS_THIN_STRIDE = env_int("TFDASH_POINTS_THIN_STRIDE", 10, minimum=2)
# A job with this many points not yet in its rollups gets them rolled up (orchestrator/metrics/rollups.py), at most
# TFDASH_ROLLUP_BATCH points per transaction, by a periodic task every TFDASH_ROLLUP_INTERVAL_S.
TFDASH_ROLLUP_AFTER_POINTS = env_int("TFDASH_ROLLUP_AFTER_POINTS", 50_000, minimum=1)
TFDASH_ROLLUP_BATCH = env_int("TFDASH_ROLLUP_BATCH", 500_000, minimum=1)
TFDASH_ROLLUP_INTERVAL_S = env_float("TFDASH_ROLLUP_INTERVAL_S", 10.0)
# Artifacts one job may store: how many and how many bytes in all (one artifact is at most 64 MiB: contracts/limits).
TFDASH_MAX_ARTIFACTS_PER_JOB = env_int("TFDASH_MAX_ARTIFACTS_PER_JOB", 16, minimum=1)
TFDASH_MAX_ARTIFACT_BYTES_PER_JOB = env_int("TFDASH_MAX_ARTIFACT_BYTES_PER_JOB", 256 * 1024 * 1024, minimum=1)
# On a cluster with an object store artifacts are objects there, each up to 5 GiB (contracts/store.py).
TFDASH_MAX_STORE_ARTIFACT_BYTES_PER_JOB = env_int("TFDASH_MAX_STORE_ARTIFACT_BYTES_PER_JOB", 20 * 1024**3, minimum=1)
# API tokens one user may hold at once (one per `tfdash login`, per device); expired ones do not count.
TFDASH_MAX_API_TOKENS_PER_USER = env_int("TFDASH_MAX_API_TOKENS_PER_USER", 50, minimum=1)
# An uploaded training script (form, API, `submit`).
TFDASH_MAX_SCRIPT_BYTES = env_int("TFDASH_MAX_SCRIPT_BYTES", 1024 * 1024, minimum=1)
# Points a reconnecting job page is sent at most (`?since=`); a larger backlog is replaced by a fresh thinned load.
TFDASH_SOCKET_BACKLOG_POINTS = env_int("TFDASH_SOCKET_BACKLOG_POINTS", 20_000, minimum=1)
# An open job page socket checks its user's right to the job again this often (dashboard/access.py), as well as at
# once on sign-out, on a change of the user and on every change of the job: the default is Daphne's WebSocket ping
# interval, the socket's own heartbeat.
TFDASH_SOCKET_RECHECK_S = env_float("TFDASH_SOCKET_RECHECK_S", 20.0)
# Host samples: kept whole for TFDASH_SAMPLES_FULL_S, then thinned to one per TFDASH_SAMPLES_THIN_S per host, by a
# periodic task that deletes at most TFDASH_RETENTION_BATCH rows a run (every TFDASH_RETENTION_INTERVAL_S).
TFDASH_SAMPLES_FULL_S = env_int("TFDASH_SAMPLES_FULL_S", 86_400, minimum=1)
TFDASH_SAMPLES_THIN_S = env_int("TFDASH_SAMPLES_THIN_S", 60, minimum=1)
TFDASH_RETENTION_BATCH = env_int("TFDASH_RETENTION_BATCH", 20_000, minimum=1)
TFDASH_RETENTION_INTERVAL_S = env_float("TFDASH_RETENTION_INTERVAL_S", 300.0)
# The control plane's Ed25519 signing key for orders to agents (orchestrator/identity/keys.py): a file holding it (PEM
# or base64 of the raw 32 bytes; `make run` generates var/control-key, mode 0600), else the value itself.
TFDASH_CONTROL_KEY_FILE = env_str("TFDASH_CONTROL_KEY_FILE", "")
TFDASH_CONTROL_KEY = env_str("TFDASH_CONTROL_KEY", "")
# Agent messages (contracts/signing.py) are accepted from MAX_SKEW_S ahead of this machine's clock to MAX_AGE_S old.
# Celery messages (hello, heartbeat, task events): their nonces are remembered this long, so one is never applied
# twice; 5 minutes covers a busy orchestrator's queue and its retries of a handler that met an outage.
TFDASH_MESSAGE_MAX_AGE_S = env_float("TFDASH_MESSAGE_MAX_AGE_S", 300.0)
TFDASH_MESSAGE_MAX_SKEW_S = env_float("TFDASH_MESSAGE_MAX_SKEW_S", 30.0)
# Stream entries (metrics, logs, artifacts, host samples) are refused when Redis appended them more than this long
# after the agent sealed them (orchestrator/identity/stream_marks.py), and one appended again is refused as a replay.
# Measured to the append, not the read: entries waiting while the ingest is down are kept. An agent seals as it sends,
# in the round trip that appends (5 s socket timeouts), so legitimate entries are a clock skew plus a transit old:
# two minutes leaves 90 s of transit past that skew (TFDASH_MESSAGE_MAX_SKEW_S, 30 s), and a report held through a
# broker outage is sealed afresh when it leaves (worker_agent/outbox.py).
TFDASH_STREAM_MAX_AGE_S = env_float("TFDASH_STREAM_MAX_AGE_S", 120.0)
# How many ingest processes share the hosts' metric streams (`manage.py ingest_metrics --partition P`, one process
# per P in 0..N-1; contracts/protocol.py ingest_partition): every process must be started with the same N.
TFDASH_INGEST_PARTITIONS = max(1, int(env_float("TFDASH_INGEST_PARTITIONS", 1)))
# The ingest is behind when the oldest metric-stream entry it has not stored is older than this: the cluster page tells
# the staff (with how to add partitions), and GET /metrics says so (tfdash_ingest_behind).
TFDASH_INGEST_BEHIND_S = env_float("TFDASH_INGEST_BEHIND_S", 10.0)
# GET /metrics for a scraper without a session: `Authorization: Bearer <this>` (empty: staff sessions only).
TFDASH_METRICS_TOKEN = env_str("TFDASH_METRICS_TOKEN", "")
# Webhooks (orchestrator/webhooks/): how often the outbox is swept, a sweep's time for starting POSTs, one POST's
# deadline in all (name lookup, connect, send, read: GitHub gives a delivery 10 s), how many POSTs one sweep has in
# flight at once, the retries' backoff (doubling from BASE up to MAX) and how many tries before a delivery is failed.
TFDASH_WEBHOOK_SWEEP_S = env_float("TFDASH_WEBHOOK_SWEEP_S", 2.0)
TFDASH_WEBHOOK_SWEEP_BUDGET_S = env_float("TFDASH_WEBHOOK_SWEEP_BUDGET_S", 20.0)
TFDASH_WEBHOOK_DEADLINE_S = env_float("TFDASH_WEBHOOK_DEADLINE_S", 10.0)
TFDASH_WEBHOOK_CONCURRENCY = env_int("TFDASH_WEBHOOK_CONCURRENCY", 16, minimum=1)
TFDASH_WEBHOOK_RETRY_BASE_S = env_float("TFDASH_WEBHOOK_RETRY_BASE_S", 5.0)
TFDASH_WEBHOOK_RETRY_MAX_S = env_float("TFDASH_WEBHOOK_RETRY_MAX_S", 600.0)
TFDASH_WEBHOOK_MAX_ATTEMPTS = env_int("TFDASH_WEBHOOK_MAX_ATTEMPTS", 15, minimum=1)
# The dashboard's address as receivers should link to it (webhook payloads); empty: links are paths only.
TFDASH_PUBLIC_URL = env_str("TFDASH_PUBLIC_URL", "")

CELERY_BEAT_SCHEDULE = {
    "host-watchdog": {
        "task": "orchestrator.watchdog",
        "schedule": TFDASH_WATCHDOG_INTERVAL_S,
        "options": {"expires": TFDASH_WATCHDOG_INTERVAL_S * 2},
    },
    "webhooks": {
        "task": "orchestrator.webhooks",
        "schedule": TFDASH_WEBHOOK_SWEEP_S,
        # Their own queue and worker: a POST never holds a thread of the hosts' events, the watchdog or scheduling.
        "options": {"expires": TFDASH_WEBHOOK_SWEEP_S * 2, "queue": WEBHOOKS_QUEUE},
    },
    "rollups": {
        "task": "orchestrator.rollups",
        "schedule": TFDASH_ROLLUP_INTERVAL_S,
        "options": {"expires": TFDASH_ROLLUP_INTERVAL_S},
    },
    "retention": {
        "task": "orchestrator.retention",
        "schedule": TFDASH_RETENTION_INTERVAL_S,
        "options": {"expires": TFDASH_RETENTION_INTERVAL_S},
    },
}
