"""What one user, job or task may hold, and what each says when it is reached: the one definition of every per-user
bound (the numbers are settings, config/settings.py; README "Limits").

Each rule is a plain function of numbers the caller has already read, so the code that enforces it (submission,
the ingest, the artifact store) keeps its own transaction and queries, and every message names the setting to raise.
"""

from __future__ import annotations

from django.conf import settings

from contracts.metric_messages import SHED_STRIDE


def _bytes(n: int) -> str:
    return f"{n:,} bytes"


# --- queued + running jobs per user ---


def active_jobs_problem(active: int) -> str | None:
    """Why one more job may not be submitted by a user who has `active` jobs not yet ended (None: it may)."""
    limit = settings.TFDASH_MAX_ACTIVE_JOBS_PER_USER
    if _room_for(active, 1):
        return None
    return (
        f"You already have {active} queued or running jobs; the limit is {limit} per user "
        "(TFDASH_MAX_ACTIVE_JOBS_PER_USER). Wait for one to end or cancel one, then submit again."
    )


def jobs_at_once_problem(active: int, wanted: int) -> str | None:
    """Why a user who has `active` jobs not yet ended may not queue `wanted` more at once (an experiment's variants
    side by side), None when they may."""
    if _room_for(active, wanted):
        return None
    limit = settings.TFDASH_MAX_ACTIVE_JOBS_PER_USER
    return (
        f"that takes {wanted} places; you have {active} queued or running jobs and the limit is {limit} per user "
        "(TFDASH_MAX_ACTIVE_JOBS_PER_USER)."
    )


def _room_for(active: int, wanted: int) -> bool:
    return active + wanted <= settings.TFDASH_MAX_ACTIVE_JOBS_PER_USER


# --- uploaded scripts ---


def script_size_problem(size: int) -> str | None:
    limit = settings.TFDASH_MAX_SCRIPT_BYTES
    if size <= limit:
        return None
    return f"The script is {_bytes(size)}; the limit is {_bytes(limit)} (TFDASH_MAX_SCRIPT_BYTES)."


# --- log bytes per task attempt ---


def line_bytes(text: str) -> int:
    """What one stored line counts against its task's log: its UTF-8 bytes and the newline a download adds."""
    return len(text.encode("utf-8", errors="replace")) + 1


def log_truncated_marker() -> str:
    """The one line stored in place of everything a task wrote past its log limit."""
    return (
        f"… log truncated after {_bytes(settings.TFDASH_MAX_LOG_BYTES_PER_TASK)}; the rest was dropped "
        "(limit TFDASH_MAX_LOG_BYTES_PER_TASK)"
    )


# --- metric points per job ---


def keep_point(stored: int, phase: str, step: int) -> bool:
    """Whether a new point of a job that already stores `stored` points is stored.

    Up to TFDASH_MAX_POINTS_PER_JOB every point; then, up to twice that, the series go on thinned: every epoch_end
    point (one per epoch, what comparisons read) and train/custom points on every TFDASH_POINTS_THIN_STRIDE-th step
    only, so the curve keeps its shape to the end of the run; past twice the limit nothing more (a script choosing
    its steps could otherwise pass the stride forever)."""
    limit = settings.TFDASH_MAX_POINTS_PER_JOB
    if stored < limit:
        return True
    if stored >= 2 * limit:
        return False
    return phase == "epoch_end" or step % settings.TFDASH_POINTS_THIN_STRIDE == 0


def points_thinned_note(stored: int, thinned: int) -> str:
    """What the job page says once points were left out."""
    limit = settings.TFDASH_MAX_POINTS_PER_JOB
    stride = settings.TFDASH_POINTS_THIN_STRIDE
    return (
        f"The metric series were thinned: past {limit:,} points per job only every {stride}th step (and every "
        f"epoch end) is stored, past {2 * limit:,} none (limit TFDASH_MAX_POINTS_PER_JOB); {thinned:,} points "
        f"were not stored, {stored:,} are."
    )


def points_shed_note(shed: int) -> str:
    """What the job page says once agents left points out because the ingest was behind (contracts/protocol.py
    SHED_BACKLOG)."""
    return (
        f"While the metrics ingest was far behind, the agents sent only every {SHED_STRIDE}th step of the step-level "
        f"points (and every epoch end): {shed:,} points were left out."
    )


# --- artifacts per job ---


def artifact_problem(name: str, size: int, count: int, total: int, *, in_store: bool = False) -> str | None:
    """Why artifact `name` of `size` bytes may not join a job that holds `count` others of `total` bytes in all (not
    counting one of the same name, which it replaces). A job on a cluster with an object store has its own byte cap
    (its artifacts are not rows)."""
    max_count = settings.TFDASH_MAX_ARTIFACTS_PER_JOB
    max_total = (
        settings.TFDASH_MAX_STORE_ARTIFACT_BYTES_PER_JOB if in_store else settings.TFDASH_MAX_ARTIFACT_BYTES_PER_JOB
    )
    if count >= max_count:
        return (
            f"Artifact {name} was refused: the job already has {count} artifacts, as many as allowed "
            f"(TFDASH_MAX_ARTIFACTS_PER_JOB={max_count})."
        )
    if total + size > max_total:
        setting = "TFDASH_MAX_STORE_ARTIFACT_BYTES_PER_JOB" if in_store else "TFDASH_MAX_ARTIFACT_BYTES_PER_JOB"
        return (
            f"Artifact {name} ({_bytes(size)}) was refused: it would bring the job's artifacts to "
            f"{_bytes(total + size)}, past the limit of {_bytes(max_total)} ({setting})."
        )
    return None


# --- API tokens per user ---


def api_tokens_problem(held: int) -> str | None:
    """Why a user who holds `held` unexpired API tokens may not be given one more (None: they may)."""
    limit = settings.TFDASH_MAX_API_TOKENS_PER_USER
    if held < limit:
        return None
    return (
        f"You already hold {held} API tokens, as many as allowed (TFDASH_MAX_API_TOKENS_PER_USER={limit}). Revoke one "
        "on the API tokens page or with DELETE /api/tokens/<id>/, then sign in again."
    )
