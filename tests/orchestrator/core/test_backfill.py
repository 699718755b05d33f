"""Backfill over reservations, on crafted queues replayed in simulated time: jobs start as the planner says, run to
their limits (the worst case the planner assumes) or end early, and every end triggers a new pass."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.strategies import Strategy
from orchestrator.core import backfill, backfill_terms, placement
from orchestrator.core.hosts import HostState
from orchestrator.core.placement import Placement, place
from orchestrator.core.preemption import Candidate, choose_victims
from orchestrator.core.scheduler_policy import POLICIES
from orchestrator.core.shapes import JobShape

MWMS = Strategy.MULTI_WORKER_MIRRORED


def host(name: str, devices: int = 4) -> HostState:
    return HostState(
        name=name,
        address=f"10.0.0.{ord(name[-1]) - ord('a') + 1}",
        port_min=23000,
        port_max=23099,
        device_ids=tuple(range(devices)),
        gpu=True,
        labels=frozenset(),
        online=True,
        used_devices=frozenset(),
        used_ports=frozenset(),
    )


def release(states: list[HostState], devices: backfill_terms.Devices) -> list[HostState]:
    return backfill_terms.free(states, devices)


@dataclass
class Job:
    id: int
    workers: int
    devices: int  # per worker
    limit: float
    runs: float  # its true run time (<= limit)

    @property
    def shape(self) -> JobShape:
        return JobShape(MWMS, self.workers, 0, self.devices)


def simulate(jobs: list[Job], hosts: list[HostState], *, fifo: bool) -> tuple[dict[int, float], dict[int, float]]:
    """Start times of every job, and the first reservation each got as the head of the queue (the first waiting job),
    replaying the queue pass by pass."""
    policy = POLICIES["fifo" if fifo else "backfill"]
    states = list(hosts)
    now = 0.0
    waiting = list(jobs)
    running: list[tuple[float, float, int, backfill_terms.Devices]] = []  # (true end, limit end, id, devices)
    started: dict[int, float] = {}
    first_reserved: dict[int, float] = {}
    for _ in range(1000):
        gangs = [backfill_terms.Running(job_id, limit_end, devices) for _end, limit_end, job_id, devices in running]
        planner = backfill.Planner(states, gangs, now=now, depth=policy.reservations(), take=placement.take)
        for job in list(waiting):
            outcome = planner.offer(backfill_terms.Waiting(job.id, job.shape, job.limit))
            if isinstance(outcome, Placement):
                started[job.id] = now
                waiting.remove(job)
                running.append((now + job.runs, now + job.limit, job.id, backfill_terms.devices_of(outcome)))
            elif policy.holds_back:
                break
        planner.finish(plan_all=True)
        states = planner.states
        head = planner.outcome.reservations.get(waiting[0].id) if waiting else None
        if head is not None:
            first_reserved.setdefault(head.job_id, head.start)
        if not waiting:
            return started, first_reserved
        running.sort()
        end, _limit_end, _job_id, devices = running.pop(0)
        now = end
        states = release(states, devices)
    raise AssertionError("the queue never drained")


HOSTS = [host("h-a"), host("h-b")]  # 8 devices


def crafted() -> list[Job]:
    """A wide head behind a running half-fleet job, then small jobs: some end before the head's reservation, one
    would run across it."""
    return [
        Job(1, workers=1, devices=4, limit=100, runs=100),  # takes h-a until t=100
        Job(2, workers=2, devices=4, limit=50, runs=50),  # the head: needs both hosts, waits for job 1
        Job(3, workers=1, devices=2, limit=60, runs=60),  # fits now on h-b, ends before t=100: backfilled
        Job(4, workers=1, devices=2, limit=90, runs=30),  # fits now on h-b, its limit ends before t=100: backfilled
        Job(5, workers=1, devices=2, limit=500, runs=20),  # would hold h-b past t=100: must not start before the head
        Job(6, workers=1, devices=1, limit=10, runs=10),
    ]


def test_backfill_starts_small_jobs_early_and_never_delays_the_head() -> None:
    fifo, _ = simulate(crafted(), HOSTS, fifo=True)
    easy, reserved = simulate(crafted(), HOSTS, fifo=False)
    assert fifo[2] == 100 and easy[2] == 100  # the head's start is the same with backfill
    assert reserved[2] == 100  # and it was promised that from the first pass
    assert easy[3] == 0 and easy[4] == 0 and fifo[3] >= 150  # what fits before the reservation starts at once
    assert easy[5] >= 100  # it would have run across the head's reservation on the reserved host
    assert sum(easy.values()) < sum(fifo.values())


def test_a_job_using_none_of_the_reserved_devices_starts_whatever_its_limit() -> None:
    hosts = [host("h-a"), host("h-b"), host("h-c", devices=2)]
    jobs = [
        Job(1, workers=2, devices=4, limit=100, runs=100),  # h-a and h-b
        Job(2, workers=2, devices=4, limit=50, runs=50),  # the head: only h-a and h-b can hold it
        Job(3, workers=1, devices=2, limit=1000, runs=10),  # runs far past the reservation, on h-c
    ]
    started, reserved = simulate(jobs, hosts, fifo=False)
    assert reserved[2] == 100 and started[2] == 100  # the head starts when it was promised
    assert started[3] == 0  # it stays off the reserved hosts, so its long limit does not matter
    fifo, _ = simulate(jobs, hosts, fifo=True)
    assert fifo[3] == 100


def test_the_head_starts_by_its_reservation_and_jobs_wait_less_on_random_queues() -> None:
    import random

    fifo_waits, easy_waits = 0.0, 0.0
    for seed in range(30):
        rng = random.Random(seed)
        jobs = []
        for i in range(1, 25):
            limit = float(rng.choice([10, 20, 50, 100]))
            jobs.append(Job(i, workers=rng.choice([1, 1, 2]), devices=rng.choice([1, 2, 4]), limit=limit,
                            runs=limit))  # fmt: skip
        fifo, _ = simulate(jobs, HOSTS, fifo=True)
        easy, reserved = simulate(jobs, HOSTS, fifo=False)
        # Jobs run to their limits here: every head starts no later than it was first promised, as the head.
        assert reserved
        for job_id, promised in reserved.items():
            assert easy[job_id] <= promised, (seed, job_id)
        fifo_waits += sum(fifo.values())
        easy_waits += sum(easy.values())
    assert easy_waits < fifo_waits


def test_counting_free_devices_first_changes_no_plan(monkeypatch) -> None:
    """The planner rules most shapes out by counting free devices before it tries a placement (a spread fleet leaves
    a few free devices on every host, and wide workers fit none): on random fleets and queues every start and every
    reservation is the same with the count as without it."""
    import random

    # Queues of 60 jobs of a few dozen shapes, limits drawn apart: jobs of one shape meet different reservations in
    # their way, and reservations are made in the middle of a pass.
    for seed in range(24):
        rng = random.Random(seed)
        hosts = [host(f"h-{c}", devices=rng.choice([2, 4, 8])) for c in "abcdef"]
        jobs = []
        for i in range(1, 61):
            runs = float(rng.choice([10, 20, 50, 100]))
            jobs.append(Job(i, workers=rng.choice([1, 1, 2, 4]), devices=rng.choice([1, 2, 4, 8]),
                            limit=runs * rng.choice([1, 1.5, 2, 3]), runs=runs))  # fmt: skip
        jobs = [job for job in jobs if isinstance(place(job.shape, hosts), Placement)]  # each fits the idle fleet
        monkeypatch.setattr(backfill, "COUNT_FIRST", True)
        counted = simulate(jobs, hosts, fifo=False)
        monkeypatch.setattr(backfill, "COUNT_FIRST", False)
        placed = simulate(jobs, hosts, fifo=False)
        assert counted == placed, seed


def test_preemption_frees_the_fewest_devices_losing_the_least_work() -> None:
    states = [host("h-a").with_used((), range(4)), host("h-b").with_used((), range(4))]
    shape = JobShape(MWMS, 1, 0, 2)
    candidates = [
        Candidate(10, {"h-a": frozenset(range(4))}, since_checkpoint_s=5),  # 4 devices
        Candidate(11, {"h-b": frozenset({0, 1})}, since_checkpoint_s=300),  # 2 devices, much work to redo
        Candidate(12, {"h-b": frozenset({2, 3})}, since_checkpoint_s=20),  # 2 devices, checkpointed recently
    ]
    assert choose_victims(shape, states, candidates) == [12]
    assert choose_victims(JobShape(MWMS, 2, 0, 4), states, candidates) == [11, 12, 10] or sorted(
        choose_victims(JobShape(MWMS, 2, 0, 4), states, candidates) or []
    ) == [10, 11, 12]
    assert choose_victims(JobShape(MWMS, 3, 0, 4), states, candidates) is None  # not enough even with all


def test_a_victim_that_is_not_needed_after_all_is_given_back() -> None:
    states = [host("h-a", devices=2).with_used((), {0, 1}), host("h-b", devices=4).with_used((), range(4))]
    shape = JobShape(MWMS, 1, 0, 4)
    candidates = [
        Candidate(20, {"h-a": frozenset({0, 1})}, since_checkpoint_s=1),  # cheapest, but h-a is too small anyway
        Candidate(21, {"h-b": frozenset(range(4))}, since_checkpoint_s=1),
    ]
    assert choose_victims(shape, states, candidates) == [21]
    assert isinstance(place(shape, backfill_terms.free(states, {"h-b": frozenset(range(4))})), Placement)
