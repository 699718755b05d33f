"""The queue's order and its rules: priority classes, time limits, quotas and fair share, preemption candidates.

Order (Slurm's multifactor, reduced to what a team needs): preflights first (orchestrator/core/preflight.py), then
the priority class's value, then fair share (an account under its quota before one over it; then the higher
fair-share factor, from the account's decayed usage against its share: orchestrator/core/fair_share.py; then the
account using the smaller part of its quota now), then submission (a restarted or preempted job keeps its
`created_at`, so its place). Without quotas, shares are equal and the last tie is the devices an account uses now:
fewer first. An account is the user's own quota on the
cluster, else the largest quota of one of their groups (shared by the group's members), else none. On a cluster where
staff set no quota nobody is over; where they set any, a user with none has a quota of 0 (all they run is borrowed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import connection

from orchestrator.core import fair_share, preemption, preflight
from orchestrator.models import Cluster, DecayedUsage, Job, JobState, PriorityClass, Quota
from orchestrator.models.queueing import STANDARD_CLASSES
from orchestrator.scheduler import class_rights

WAITING_STATES = (JobState.QUEUED, JobState.RESTARTING, JobState.PREEMPTED)

Account = tuple[str, int]  # ("user", id) or ("group", id)


def default_class() -> PriorityClass | None:
    standard_classes_if_none()
    return PriorityClass.objects.filter(is_default=True).first()


def standard_classes_if_none() -> None:
    """A fleet with no class at all (a fresh test database flushed after its migrations, say) gets the standard
    three: a job naming `low`, `normal` or `high` always finds them, as the README promises."""
    if PriorityClass.objects.exists():
        return
    for name, value, preemptible, default, open_to_all, text in STANDARD_CLASSES:
        PriorityClass.objects.get_or_create(
            name=name,
            defaults={
                "value": value,
                "preemptible": preemptible,
                "is_default": default,
                "open_to_all": open_to_all,
                "description": text,
            },
        )


def settle(job: Job) -> list[tuple[str, str]]:
    """Resolve a new job's priority class (by name; blank: the default; one its owner may use: class_rights) and
    time limit (none: the cluster's default; never above its maximum). Returns (field, message) problems."""
    errors: list[tuple[str, str]] = []
    asked = getattr(job, "asked_priority", None)
    if asked is not None:
        standard_classes_if_none()
        found = PriorityClass.objects.filter(name=asked).first() if asked else default_class()
        if asked and found is None:
            names = ", ".join(PriorityClass.objects.values_list("name", flat=True)) or "none defined"
            errors.append(("priority", f"Unknown priority class {asked!r}; choose one of: {names}."))
        elif found is not None:
            # A class is a right, not a wish: checked here, where every path that names one for a new job passes.
            refused = class_rights.refusal(found, job.owner)
            if refused:
                errors.append(("priority", refused))
        job.priority_class = found
    cluster = job.cluster
    if not job.time_limit_s:
        # A default staff set above the maximum is the maximum.
        job.time_limit_s = min(cluster.default_time_limit_s, cluster.max_time_limit_s)
    elif job.time_limit_s > cluster.max_time_limit_s:
        errors.append(
            ("time_limit_s", f"At most {cluster.max_time_limit_s} s on cluster {cluster.name} (its maximum).")
        )
    return errors


@dataclass
class Shares:
    """Who is which account on a cluster, each account's quota, what it uses now (devices of active tasks), its
    decayed usage (ended and running tasks, device-seconds) and its fair-share factor (orchestrator/core/
    fair_share.py)."""

    account_of: dict[int, Account]
    quota: dict[Account, int | None]
    usage: dict[Account, int]
    decayed: dict[Account, float]
    factor: dict[Account, float]

    def over(self, owner_id: int, more: int) -> bool:
        """Whether `owner_id`'s account would be beyond its quota with `more` devices."""
        account = self.account_of[owner_id]
        quota = self.quota[account]
        return quota is not None and self.usage[account] + more > quota

    def ratio(self, owner_id: int) -> float:
        account = self.account_of[owner_id]
        quota = self.quota[account]
        used = self.usage[account]
        if quota is None:
            return float(used)  # no quotas on the cluster: the account using fewer devices now goes first
        return used / quota if quota else float(used + 1) * 1e9

    def factor_of(self, owner_id: int) -> float:
        return self.factor.get(self.account_of[owner_id], 1.0)

    def use(self, owner_id: int, devices: int) -> None:
        self.usage[self.account_of[owner_id]] += devices


def shares(
    cluster: Cluster,
    owner_ids: Iterable[int],
    usage_by_owner: dict[int, int],
    held_since: dict[int, dict[float, int]],
    now: float,
) -> Shares:
    """`usage_by_owner`: the devices each owner's active tasks hold on the cluster, `held_since` since when
    (fleet_state.running_gangs)."""
    owners = set(owner_ids)
    quotas = list(Quota.objects.filter(cluster=cluster).values_list("user_id", "group_id", "devices"))
    user_quota = {user: devices for user, group, devices in quotas if user is not None}
    group_quota = {group: devices for user, group, devices in quotas if group is not None}
    owners |= set(usage_by_owner)
    memberships: dict[int, list[int]] = defaultdict(list)
    if group_quota:
        through = get_user_model().groups.through
        for user_id, group_id in through.objects.filter(user_id__in=owners, group_id__in=group_quota).values_list(
            "user_id", "group_id"
        ):
            memberships[user_id].append(group_id)
    account_of: dict[int, Account] = {}
    quota: dict[Account, int | None] = {}
    for owner in owners:
        if owner in user_quota:
            account: Account = ("user", owner)
            quota[account] = user_quota[owner]
        elif memberships.get(owner):
            group = max(memberships[owner], key=lambda g: (group_quota[g], -g))
            account = ("group", group)
            quota[account] = group_quota[group]
        else:
            account = ("user", owner)
            quota[account] = 0 if quotas else None
        account_of[owner] = account
    usage: dict[Account, int] = defaultdict(int)
    for owner, devices in usage_by_owner.items():
        usage[account_of[owner]] += devices
    decayed = _decayed(cluster, account_of, held_since, now)
    # Shares: the quotas' devices, or equal when the cluster has none.
    entitled = {account: float(q) for account, q in quota.items()} if quotas else fair_share.equal_shares(quota)
    return Shares(account_of, quota, usage, decayed, fair_share.factors(decayed, entitled))


def _decayed(
    cluster: Cluster, account_of: dict[int, Account], held_since: dict[int, dict[float, int]], now: float
) -> dict[Account, float]:
    """Each account's decayed device-seconds now: its members' ended tasks (DecayedUsage) and running ones."""
    half_life = cluster.fair_share_half_life_s
    decayed: dict[Account, float] = defaultdict(float)
    rows = DecayedUsage.objects.filter(cluster=cluster, user_id__in=list(account_of))
    for owner, value, as_of in rows.values_list("user_id", "value", "as_of"):
        decayed[account_of[owner]] += fair_share.decay(value, now - as_of, half_life)
    for owner, since in held_since.items():
        if owner in account_of:
            for placed_at, devices in since.items():
                decayed[account_of[owner]] += fair_share.accrued(devices, placed_at, now, half_life)
    return decayed


def class_values() -> tuple[dict[int, tuple[int, bool]], int]:
    """Each class's (value, preemptible) by id, and the value of a job with no class (the default's)."""
    rows = list(PriorityClass.objects.values_list("pk", "value", "preemptible", "is_default"))
    if not rows:
        default = default_class()  # makes the standard classes
        return class_values() if default is not None else ({}, 0)
    classes = {pk: (value, preemptible) for pk, value, preemptible, _default in rows}
    default_value = next((value for _pk, value, _p, is_default in rows if is_default), 0)
    return classes, default_value


def class_protections() -> tuple[dict[int, preemption.Protection], preemption.Protection]:
    """Each class's protection of its running jobs by id, and that of a job with no class (the default's)."""
    standard_classes_if_none()
    classes = list(PriorityClass.objects.all())
    default = next((pc.protection for pc in classes if pc.is_default), PriorityClass().protection)
    return {pc.pk: pc.protection for pc in classes}, default


@dataclass(slots=True)
class Queued:
    """A waiting job as the queue is ordered and a scheduler pass plans it: its columns the order and placement
    read, not a model instance (a busy queue is a thousand rows a pass; making and decoding them was a tenth of it).
    The few a pass starts or reserves for are read whole."""

    pk: int
    owner_id: int
    state: str
    reason: str
    held: bool
    priority_class_id: int | None
    time_limit_s: int
    strategy: str
    workers: int
    ps: int
    devices_per_worker: int
    labels: str
    environment: str
    restarts: int
    told_start: bool  # an expected start (and its reservation) is stored on its row
    awaits: int | None  # the preflight it waits for (orchestrator/core/preflight.py `awaited`): not placed meanwhile
    checks: int | None  # on a preflight: the job it checks (placed ahead of the queue)
    rank: int  # its place by submission (created_at, then id): a restarted or preempted job keeps it
    borrowing: bool = False  # a pass that starts it beyond its owner's quota says so


# What `queued` reads of a job's row (the rest is the pass's), in Queued's order. The scheduler writes a job's expected
# start and its reservation together (both set, or both cleared): `told_start` is whether they are.
_QUEUED_SQL = f"""
    SELECT id, owner_id, state, reason, held, priority_class_id, time_limit_s, strategy, workers, ps,
           devices_per_worker, labels, environment, restarts,
           (expected_start IS NOT NULL OR reservation <> '{{}}'::jsonb),
           CASE WHEN preflight->>'state' = %s AND jsonb_typeof(preflight->'job') = 'number'
                THEN (preflight->>'job')::bigint END,
           preflight_for_id
    FROM {Job._meta.db_table} WHERE cluster_id = %s AND state = ANY(%s) ORDER BY created_at, id
"""  # noqa: S608 - a table name from the model, every value a parameter


def queued(cluster_id: int) -> list[Queued]:
    """The cluster's waiting jobs, by submission. (Read as plain rows: every pass reads the whole queue, and the
    ORM's rows cost twice as much as the query.)"""
    with connection.cursor() as cursor:
        cursor.execute(_QUEUED_SQL, [preflight.RUNNING, cluster_id, [str(state) for state in WAITING_STATES]])
        rows = cursor.fetchall()
    return [Queued(*row, rank=rank) for rank, row in enumerate(rows)]


def _standing(
    class_id: int | None,
    owner_id: int,
    need: int,
    classes: dict[int, tuple[int, bool]],
    default_value: int,
    share: Shares,
) -> tuple[int, bool, float, float]:
    """What orders jobs before their submission: class, then fair share."""
    value = classes[class_id][0] if class_id in classes else default_value
    return (-value, share.over(owner_id, need), -share.factor_of(owner_id), share.ratio(owner_id))


def sort_queue(
    jobs: list[Queued],
    classes: dict[int, tuple[int, bool]],
    default_value: int,
    share: Shares,
    need_of: Callable[[Queued], int],
) -> dict[int, str]:
    """Sort waiting jobs (in place) into the queue's order (this module's docstring), `need_of(job)` their devices. A
    queue's jobs share a few (class, owner, devices) standings, each computed once (every pass sorts the whole
    queue). Returns, for each job that fair share put behind a job submitted after it, a note saying so."""
    standings: dict[tuple[int | None, int, int], tuple[int, bool, float, float]] = {}

    def key(job: Queued) -> tuple[bool, tuple[int, bool, float, float], int]:
        asked = (job.priority_class_id, job.owner_id, need_of(job))
        standing = standings.get(asked)
        if standing is None:
            standing = standings[asked] = _standing(*asked, classes, default_value, share)
        # Preflights first: one device each for at most their time limit (orchestrator/core/preflight.py), so a job
        # is refused or cleared before it waits for its gang.
        return (job.checks is None, standing, job.rank)

    jobs.sort(key=key)
    return _passed_by_fair_share(jobs, [key(job) for job in jobs])


BEHIND_BY_FAIR_SHARE = "fair share puts #{ahead} ahead of it (its account's factor {theirs:.2f} against {ours:.2f})"


def _passed_by_fair_share(
    ordered: list[Queued], keys: list[tuple[bool, tuple[int, bool, float, float], int]]
) -> dict[int, str]:
    """The jobs of a class (and quota standing) behind the first of theirs, when that one was submitted later and
    only its account's higher fair-share factor put it first: one note each, naming it."""
    first: dict[tuple[bool, int, bool], tuple[Queued, float]] = {}
    notes: dict[int, str] = {}
    for job, (plain, (value, over, neg_factor, _ratio), rank) in zip(ordered, keys, strict=True):
        group = (plain, value, over)
        if group not in first:
            first[group] = (job, -neg_factor)
            continue
        ahead, theirs = first[group]
        if ahead.rank > rank and theirs > -neg_factor and ahead.owner_id != job.owner_id:
            notes[job.pk] = BEHIND_BY_FAIR_SHARE.format(ahead=ahead.pk, theirs=theirs, ours=-neg_factor)
    return notes
