"""Fair share with memory: each account's decayed usage against its share, as Slurm's classic fair-share factor.

Plain Python, shared by the scheduler (orchestrator/scheduler/queueing.py orders the queue with it), the queue view
and bench/fair_share_replay.py, so the three compute the same numbers.

Usage decays with a half-life h: a device-second used `a` seconds ago counts 2^(-a/h). A task holding d devices from
s to e has accrued, at e, d·h/ln2·(1 - 2^(-(e-s)/h)) (the integral of the decay over its run), and that total decays
by 2^(-(t-e)/h) after its end. So an account's decayed usage is one number and the time it was taken at: adding a
task's share at its end, or reading it at any later time, is exact with no history kept (orchestrator/models/
queueing.py DecayedUsage stores it; running tasks are added live from their placement).

The factor is Slurm's classic F = 2^(-U/S) (U: the account's part of all decayed usage on the cluster; S: its part of
all shares): 1 for an account that used nothing, 0.5 for one that used exactly its share, towards 0 beyond. Chosen
over Kueue's (which weights a ClusterQueue's borrowing, not a user's history) because the question here is Slurm's:
who has had less than their share lately. Shares are the quotas' devices, or equal when the cluster has none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

# The default half-life (Slurm's PriorityDecayHalfLife default, 7 days): a week's heavy use still counts half a week
# later, and is mostly forgotten within a month. Never 0: a half-life of 0 forgets at once, which silently turns fair
# share off (Kueue users found theirs defaulting so: kueue#15228); the cluster setting refuses less than an hour.
DEFAULT_HALF_LIFE_S = 7 * 86_400
MIN_HALF_LIFE_S = 3_600

Account = TypeVar("Account")


def decay(value: float, age_s: float, half_life_s: float) -> float:
    """`value` as it counts `age_s` seconds later."""
    return value * math.exp2(-max(age_s, 0.0) / half_life_s)


def accrued(devices: int, start: float, end: float, half_life_s: float) -> float:
    """The decayed device-seconds, as they count at `end`, of `devices` held from `start` to `end`."""
    if end <= start or devices <= 0:
        return 0.0
    return devices * half_life_s / math.log(2) * (1.0 - math.exp2(-(end - start) / half_life_s))


def added(value: float, as_of: float, more: float, more_at: float, half_life_s: float) -> tuple[float, float]:
    """An account's decayed usage (`value` taken at `as_of`) with `more` (taken at `more_at`) added: (value, as of).
    Order-free, so tasks ending out of order add up to the same."""
    at = max(as_of, more_at)
    return decay(value, at - as_of, half_life_s) + decay(more, at - more_at, half_life_s), at


def factors(usage: Mapping[Account, float], shares: Mapping[Account, float]) -> dict[Account, float]:
    """Each account's fair-share factor 2^(-U/S), for the accounts in `shares` (usage missing: none). An account with
    no share gets 0 (it may only borrow)."""
    total_usage = sum(max(u, 0.0) for u in usage.values())
    total_shares = sum(s for s in shares.values() if s > 0)
    result: dict[Account, float] = {}
    for account, share in shares.items():
        if share <= 0 or total_shares <= 0:
            result[account] = 0.0
            continue
        used = max(usage.get(account, 0.0), 0.0) / total_usage if total_usage > 0 else 0.0
        result[account] = math.exp2(-used / (share / total_shares))
    return result


def equal_shares(accounts: Iterable[Account]) -> dict[Account, float]:
    return {account: 1.0 for account in accounts}
