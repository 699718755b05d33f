"""The tally a scheduler pass keeps between passes (active_tasks.held_now) says what counting every active task afresh
(active_tasks.tally) says, pass after pass, whatever came and went: a port or device it forgot to release would never
be offered again, one it forgot to count would be booked twice."""

from __future__ import annotations

import random

from orchestrator.control import active_tasks
from orchestrator.control.active_tasks import Facts, Held

HOSTS = {1: "h-1", 2: "h-2", 3: "h-3", 4: "h-4"}
GRACE = 6.0


def normal(held: Held) -> tuple[object, ...]:
    """What a pass reads of a Held, order aside."""
    return (
        {host: frozenset(ports) for host, ports in held.ports.items() if ports},
        {host: frozenset(ids) for host, ids in held.devices.items() if ids},
        sorted((gang.job_id, gang.ends_at, sorted(gang.devices.items())) for gang in held.gangs),
        held.usage,
    )


def test_the_kept_tally_counts_what_a_fresh_tally_counts_pass_after_pass() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        kept = active_tasks._Tally(HOSTS)
        facts: dict[int, Facts] = {}
        rows: dict[int, tuple[bool, int]] = {}  # the active tasks now: id -> (being stopped, its job's limit)
        next_id, next_job = 1, 1
        for step in range(40):
            now = 1000.0 + 10 * step
            for task_id in [t for t in rows if rng.random() < 0.25]:
                del rows[task_id]  # ended
            for task_id in [t for t in rows if rng.random() < 0.1]:
                rows[task_id] = (True, rows[task_id][1])  # its stop began
            if rows and rng.random() < 0.3:  # staff changed a job's limit
                job = facts[rng.choice(list(rows))].job_id
                limit = rng.choice([5, 30, 600])
                rows.update({t: (rows[t][0], limit) for t in rows if facts[t].job_id == job})
            for _ in range(rng.randrange(4)):  # a gang placed: its tasks may share hosts, some hold no device
                placed_at = None if rng.random() < 0.1 else now - rng.choice([0, 20, 50])
                limit, owner = rng.choice([5, 30, 600]), rng.choice([7, 8])
                for _ in range(rng.randrange(1, 5)):
                    host = rng.choice(list(HOSTS))
                    devices = frozenset(rng.sample(range(8), rng.choice([0, 1, 2])))
                    port = None if rng.random() < 0.2 else rng.randrange(23000, 23010)
                    facts[next_id] = Facts(next_job, host, port, devices, placed_at, owner)
                    rows[next_id] = (False, limit)
                    next_id += 1
                next_job += 1
            listed = [(task_id, stopping, limit) for task_id, (stopping, limit) in rows.items()]
            rng.shuffle(listed)  # (the database's order)
            fresh = active_tasks.tally([(facts[t], s, limit) for t, s, limit in listed], HOSTS, now, GRACE)
            assert normal(kept.update(listed, facts, now, GRACE)) == normal(fresh), (seed, step)
