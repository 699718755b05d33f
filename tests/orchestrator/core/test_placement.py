from __future__ import annotations

import random

import pytest

from contracts.strategies import Strategy
from orchestrator.core.assignment import Packing, TaskPlacement
from orchestrator.core.hosts import HostState, capacity_summary
from orchestrator.core.placement import Placement, Unplaceable, place
from orchestrator.core.shapes import JobShape, fits_free_counts, required_tasks, validate_shape

MWMS = Strategy.MULTI_WORKER_MIRRORED
PS = Strategy.PARAMETER_SERVER


def host(
    name: str,
    *,
    address: str | None = None,
    ports: tuple[int, int] = (23000, 23009),
    devices: int = 2,
    labels: frozenset[str] = frozenset(),
    online: bool = True,
    used_devices: frozenset[int] = frozenset(),
    used_ports: frozenset[int] = frozenset(),
    excluded_ports: frozenset[int] = frozenset(),
) -> HostState:
    return HostState(
        name=name,
        address=address or f"10.0.0.{ord(name[-1]) - ord('a') + 1}",
        port_min=ports[0],
        port_max=ports[1],
        device_ids=tuple(range(devices)),
        gpu=False,
        labels=labels,
        online=online,
        used_devices=used_devices,
        used_ports=used_ports,
        excluded_ports=excluded_ports,
    )


def placed(result: Placement | Unplaceable) -> tuple[TaskPlacement, ...]:
    assert isinstance(result, Placement), result
    return result.tasks


def by_role(tasks: tuple[TaskPlacement, ...]) -> dict[tuple[str, int], TaskPlacement]:
    return {(t.type, t.index): t for t in tasks}


def test_it_spreads_two_mwms_workers_over_two_hosts() -> None:
    tasks = placed(place(JobShape(MWMS, 2, 0, 1), [host("host-a"), host("host-b")]))
    assert [(t.type, t.index, t.host, t.port, t.devices) for t in tasks] == [
        ("worker", 0, "host-a", 23000, (0,)),
        ("worker", 1, "host-b", 23000, (0,)),
    ]


def test_it_puts_a_worker_on_the_host_with_most_free_devices() -> None:
    hosts = [host("host-a", devices=4, used_devices=frozenset({0, 1, 2})), host("host-b", devices=2)]
    tasks = placed(place(JobShape(MWMS, 1, 0, 1), hosts))
    assert (tasks[0].host, tasks[0].devices) == ("host-b", (0,))


def test_it_stacks_workers_when_devices_run_out_elsewhere() -> None:
    tasks = placed(place(JobShape(MWMS, 3, 0, 2), [host("host-a", devices=4), host("host-b", devices=2)]))
    assert [(t.host, t.port, t.devices) for t in tasks] == [
        ("host-a", 23000, (0, 1)),
        ("host-b", 23000, (0, 1)),
        ("host-a", 23001, (2, 3)),
    ]


def test_it_places_mirrored_as_one_worker_with_the_lowest_free_devices() -> None:
    hosts = [host("host-a", devices=4, used_devices=frozenset({0, 2}))]
    tasks = placed(place(JobShape(Strategy.MIRRORED, 1, 0, 2), hosts))
    assert tasks == (TaskPlacement("worker", 0, "host-a", "10.0.0.1", 23000, (1, 3)),)


def test_it_places_chief_and_ps_on_the_hosts_with_fewest_tasks_of_the_job() -> None:
    hosts = [host("host-a"), host("host-b"), host("host-c", devices=0)]
    tasks = by_role(placed(place(JobShape(PS, 2, 2, 2), hosts)))
    assert tasks["worker", 0].host == "host-a"
    assert tasks["worker", 1].host == "host-b"
    assert tasks["chief", 0].host == "host-c"
    assert (tasks["ps", 0].host, tasks["ps", 0].port) == ("host-a", 23001)
    assert (tasks["ps", 1].host, tasks["ps", 1].port) == ("host-b", 23001)
    assert tasks["chief", 0].devices == tasks["ps", 0].devices == ()


def test_it_orders_tasks_chief_workers_ps_by_index() -> None:
    tasks = placed(place(JobShape(PS, 3, 2, 1), [host("host-a", devices=4)]))
    assert [(t.type, t.index) for t in tasks] == [
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
        ("ps", 0),
        ("ps", 1),
    ]


def test_it_places_every_task_or_none() -> None:
    hosts = [host("host-a", devices=1), host("host-b", devices=2, used_devices=frozenset({0}))]
    result = place(JobShape(MWMS, 3, 0, 1), hosts)
    assert result == Unplaceable("needs 3 devices in all across 3 workers; 2 are free", permanent=False)


def test_it_refuses_for_good_a_worker_bigger_than_any_host() -> None:
    result = place(JobShape(MWMS, 1, 0, 4), [host("host-a"), host("host-b")])
    assert result == Unplaceable("needs 4 devices on one host; the largest host has 2", permanent=True)


def test_it_refuses_for_good_more_devices_than_the_labelled_hosts_have() -> None:
    gpu = frozenset({"gpu"})
    hosts = [host("host-a", labels=gpu), host("host-b", labels=gpu), host("host-c", devices=8)]
    result = place(JobShape(MWMS, 3, 0, 2, labels=gpu), hosts)
    assert result == Unplaceable(
        "needs 6 devices in all across 3 workers; the cluster has 4 on hosts labelled gpu", permanent=True
    )


def test_it_refuses_for_good_workers_that_do_not_divide_onto_hosts() -> None:
    result = place(JobShape(MWMS, 3, 0, 2), [host("host-a", devices=3), host("host-b", devices=3)])
    assert result == Unplaceable("needs 3 workers with 2 devices each; the cluster fits 2", permanent=True)


def test_it_refuses_for_good_labels_no_host_has() -> None:
    result = place(JobShape(MWMS, 1, 0, 1, labels=frozenset({"gpu", "a100"})), [host("host-a")])
    assert result == Unplaceable("no host has labels {a100, gpu}", permanent=True)


def test_it_refuses_for_good_an_empty_cluster() -> None:
    assert place(JobShape(MWMS, 1, 0, 1), []) == Unplaceable("the cluster has no hosts", permanent=True)


def test_it_refuses_for_good_port_ranges_too_small_for_the_job() -> None:
    result = place(JobShape(PS, 1, 1, 1), [host("host-a", ports=(23000, 23001))])
    assert result == Unplaceable("does not fit even an empty cluster: no free port on host-a", permanent=True)


def test_it_refuses_an_invalid_shape_with_its_errors() -> None:
    result = place(JobShape(PS, 1, 0, 1), [host("host-a")])
    assert result == Unplaceable("parameter_server needs at least 1 ps", permanent=True)


def test_it_says_why_a_worker_does_not_fit_now() -> None:
    hosts = [host("host-a", devices=4, used_devices=frozenset({0, 1})), host("host-b", devices=2)]
    result = place(JobShape(MWMS, 1, 0, 4), hosts)
    assert result == Unplaceable("needs 4 devices on one host; largest free is 2", permanent=False)


def test_it_says_when_free_devices_are_split_too_thin_now() -> None:
    hosts = [host(name, devices=4, used_devices=frozenset({0})) for name in ("host-a", "host-b")]
    result = place(JobShape(MWMS, 3, 0, 2), hosts)
    assert result == Unplaceable("needs 3 workers with 2 devices each; free devices fit 2", permanent=False)


def test_it_only_uses_hosts_with_every_label() -> None:
    hosts = [
        host("host-a", devices=8, labels=frozenset({"gpu"})),
        host("host-b", labels=frozenset({"gpu", "fast"})),
        host("host-c", labels=frozenset({"fast", "gpu", "big"})),
    ]
    tasks = placed(place(JobShape(MWMS, 2, 0, 2, labels=frozenset({"gpu", "fast"})), hosts))
    assert {t.host for t in tasks} == {"host-b", "host-c"}


def test_it_skips_offline_hosts() -> None:
    hosts = [host("host-a", devices=8, online=False), host("host-b")]
    tasks = placed(place(JobShape(MWMS, 2, 0, 1), hosts))
    assert {t.host for t in tasks} == {"host-b"}


def test_it_waits_when_every_matching_host_is_offline() -> None:
    hosts = [host("host-a", online=False), host("host-b", online=False)]
    assert place(JobShape(MWMS, 1, 0, 1), hosts) == Unplaceable("2 hosts offline", permanent=False)


def test_it_mentions_offline_hosts_when_the_online_ones_are_too_small() -> None:
    hosts = [host("host-a", devices=4, online=False), host("host-b")]
    result = place(JobShape(MWMS, 1, 0, 4), hosts)
    assert result == Unplaceable("needs 4 devices on one host; largest free is 2; 1 host offline", permanent=False)


def test_it_skips_used_and_excluded_ports() -> None:
    hosts = [host("host-a", used_ports=frozenset({23000, 23002}), excluded_ports=frozenset({23001}))]
    tasks = placed(place(JobShape(MWMS, 2, 0, 1), hosts))
    assert [t.port for t in tasks] == [23003, 23004]


def test_it_waits_when_a_host_has_no_free_port() -> None:
    hosts = [host("host-a", ports=(23000, 23001), used_ports=frozenset({23000}), excluded_ports=frozenset({23001}))]
    assert place(JobShape(MWMS, 1, 0, 1), hosts) == Unplaceable("no free port on host-a", permanent=False)


def test_it_moves_a_worker_to_a_host_with_a_free_port() -> None:
    hosts = [host("host-a", devices=4, ports=(23000, 23000), used_ports=frozenset({23000})), host("host-b")]
    tasks = placed(place(JobShape(MWMS, 1, 0, 1), hosts))
    assert (tasks[0].host, tasks[0].port) == ("host-b", 23000)


def test_it_runs_out_of_ports_within_one_job() -> None:
    hosts = [host("host-a", devices=4, ports=(23000, 23002), used_ports=frozenset({23000}))]
    assert place(JobShape(MWMS, 3, 0, 1), hosts) == Unplaceable("no free port on host-a", permanent=False)


def test_it_never_gives_one_port_twice_on_loopback_addresses() -> None:
    hosts = [host("host-a", address="127.0.0.2"), host("host-b", address="127.0.0.3")]
    tasks = placed(place(JobShape(MWMS, 2, 0, 1), hosts))
    assert [(t.host, t.address, t.port) for t in tasks] == [
        ("host-a", "127.0.0.2", 23000),
        ("host-b", "127.0.0.3", 23001),
    ]


def test_it_treats_a_port_used_by_another_loopback_host_as_taken() -> None:
    hosts = [
        host("host-a", address="127.0.0.2"),
        host("host-b", address="127.0.0.3", used_ports=frozenset({23000})),
    ]
    tasks = placed(place(JobShape(MWMS, 1, 0, 1), hosts))
    assert (tasks[0].host, tasks[0].port) == ("host-a", 23001)


def test_it_reuses_a_port_number_on_different_machines() -> None:
    tasks = placed(place(JobShape(MWMS, 2, 0, 1), [host("host-a"), host("host-b")]))
    assert {t.port for t in tasks} == {23000}
    assert len({(t.address, t.port) for t in tasks}) == 2


def test_it_is_deterministic_whatever_the_host_order() -> None:
    hosts = [host(f"host-{c}", devices=3) for c in "abcde"]
    shape = JobShape(PS, 4, 2, 2)
    expected = place(shape, hosts)
    for seed in range(5):
        shuffled = hosts[:]
        random.Random(seed).shuffle(shuffled)
        assert place(shape, shuffled) == expected


# --- packing: best fit -------------------------------------------------------------------------------------------
PACK = Packing.PACK


def test_packing_puts_a_worker_on_the_host_with_the_fewest_free_devices_that_hold_it() -> None:
    hosts = [host("host-a", devices=4, used_devices=frozenset({0, 1, 2})), host("host-b", devices=2),
             host("host-c", devices=4, used_devices=frozenset({0, 1}))]  # fmt: skip
    assert placed(place(JobShape(MWMS, 1, 0, 1), hosts, packing=PACK))[0].host == "host-a"
    assert placed(place(JobShape(MWMS, 1, 0, 2), hosts, packing=PACK))[0].host == "host-b"  # host-a has 1


def test_packing_keeps_a_whole_host_free_where_spreading_splits_it() -> None:
    def after_two_small_jobs(packing: Packing) -> list[HostState]:
        hosts = [host("host-a", devices=4), host("host-b", devices=4)]
        for _ in range(2):
            where = placed(place(JobShape(MWMS, 1, 0, 1), hosts, packing=packing))[0]
            hosts = [h.with_used([where.port], where.devices) if h.name == where.host else h for h in hosts]
        return hosts

    wide = JobShape(MWMS, 1, 0, 4)
    assert placed(place(wide, after_two_small_jobs(PACK), packing=PACK))[0].host == "host-b"
    assert place(wide, after_two_small_jobs(Packing.SPREAD)) == Unplaceable(
        "needs 4 devices on one host; largest free is 3", permanent=False
    )


def test_packing_puts_a_gangs_workers_on_one_host_when_they_fit() -> None:
    tasks = placed(place(JobShape(MWMS, 2, 0, 1), [host("host-a"), host("host-b")], packing=PACK))
    assert [(t.host, t.port, t.devices) for t in tasks] == [("host-a", 23000, (0,)), ("host-a", 23001, (1,))]


def test_packing_moves_a_worker_past_a_best_fit_host_with_no_free_port() -> None:
    hosts = [host("host-a", devices=4, ports=(23000, 23000), used_ports=frozenset({23000}),
                  used_devices=frozenset({0, 1, 2})), host("host-b", devices=4)]  # fmt: skip
    tasks = placed(place(JobShape(MWMS, 1, 0, 1), hosts, packing=PACK))
    assert (tasks[0].host, tasks[0].port) == ("host-b", 23000)
    assert place(JobShape(MWMS, 1, 0, 1), hosts[:1], packing=PACK) == Unplaceable(
        "no free port on host-a", permanent=False
    )


@pytest.mark.parametrize("packing", list(Packing))
def test_random_fleets_get_every_task_on_free_devices_and_ports_by_either_packing(packing: Packing) -> None:
    rng = random.Random(7)
    for _ in range(200):
        hosts = []
        for c in "abcdef":
            n = rng.choice([2, 4, 8])
            used = frozenset(rng.sample(range(n), rng.randint(0, n)))
            hosts.append(host(f"host-{c}", devices=n, ports=(23000, 23000 + rng.randint(0, 4)), used_devices=used))
        shape = JobShape(rng.choice([MWMS, PS]), rng.randint(1, 6), rng.randint(1, 2), rng.choice([1, 2, 4]))
        result = place(shape, hosts, packing=packing)
        if isinstance(result, Unplaceable):
            continue
        by_name = {h.name: h for h in hosts}
        seats = [(t.host, d) for t in result.tasks for d in t.devices]
        assert len(seats) == len(set(seats)) == sum(t.devices for t in required_tasks(shape))
        assert all(d not in by_name[h].used_devices for h, d in seats)
        ports = [(by_name[t.host].address, t.port) for t in result.tasks]
        assert len(ports) == len(set(ports))
        if shape.strategy is MWMS and shape.workers == 1:  # one task: the first fitting host by the packing's order
            fitting = [len(h.free_devices) for h in hosts if len(h.free_devices) >= shape.devices_per_worker
                       and len(h.used_ports) <= h.port_max - h.port_min]  # fmt: skip
            best = min(fitting) if packing is PACK else max(fitting)
            assert len(by_name[result.tasks[0].host].free_devices) == best


@pytest.mark.parametrize("packing", list(Packing))
def test_free_counts_decide_whether_a_gang_fits_when_ports_are_plenty(packing: Packing) -> None:
    """The planner counts before it places (orchestrator/core/backfill.py): the count must say yes exactly when a
    placement by either packing succeeds, on fleets split every which way."""
    rng = random.Random(11)
    said = {True: 0, False: 0}
    for _ in range(400):
        hosts = []
        for c in "abcdefgh"[: rng.randint(1, 8)]:
            n = rng.choice([1, 2, 4, 8])
            used = frozenset(rng.sample(range(n), rng.randint(0, n)))
            hosts.append(host(f"host-{c}", devices=n, ports=(23000, 23099), used_devices=used,
                              online=rng.random() > 0.1))  # fmt: skip
        strategy = rng.choice([MWMS, PS, Strategy.MIRRORED])
        workers = 1 if strategy is Strategy.MIRRORED else rng.randint(1, 8)
        shape = JobShape(strategy, workers, rng.randint(1, 2) if strategy is PS else 0, rng.choice([1, 2, 3, 4, 8]))
        counted = fits_free_counts(shape, [len(h.free_devices) for h in hosts if h.online])
        placed_now = isinstance(place(shape, hosts, packing=packing), Placement)
        assert counted == placed_now, (shape, hosts)
        said[counted] += 1
    assert said[True] > 50 and said[False] > 50  # both answers were put to the test


def test_it_lists_the_tasks_each_strategy_needs() -> None:
    assert [(t.type, t.index, t.devices) for t in required_tasks(JobShape(PS, 2, 1, 3))] == [
        ("chief", 0, 0),
        ("worker", 0, 3),
        ("worker", 1, 3),
        ("ps", 0, 0),
    ]
    assert len(required_tasks(JobShape(MWMS, 3, 0, 1))) == 3
    assert len(required_tasks(JobShape(Strategy.MIRRORED, 1, 0, 2))) == 1


def test_it_accepts_valid_shapes() -> None:
    assert validate_shape(JobShape(Strategy.MIRRORED, 1, 0, 2)) == []
    assert validate_shape(JobShape(MWMS, 4, 0, 1)) == []
    assert validate_shape(JobShape(PS, 2, 1, 1)) == []


def test_it_explains_invalid_shapes_on_their_fields() -> None:
    assert validate_shape(JobShape(PS, 0, 0, 1)) == [
        ("workers", "parameter_server needs at least 1 worker"),
        ("ps", "parameter_server needs at least 1 ps"),
    ]
    assert validate_shape(JobShape(Strategy.MIRRORED, 2, 1, 1)) == [
        ("workers", "mirrored runs exactly 1 worker, not 2"),
        ("ps", "mirrored takes no parameter servers"),
    ]
    assert validate_shape(JobShape(MWMS, 0, 1, 0)) == [
        ("workers", "multi_worker_mirrored needs at least 1 worker"),
        ("ps", "multi_worker_mirrored takes no parameter servers"),
        ("devices_per_worker", "devices_per_worker must be at least 1"),
    ]
    assert validate_shape(JobShape(PS, 257, 65, 65)) == [
        ("workers", "at most 256 workers, not 257"),
        ("ps", "at most 64 ps, not 65"),
        ("devices_per_worker", "at most 64 devices per worker, not 65"),
    ]
    assert validate_shape(JobShape("ring", 1, 0, 1)) == [  # type: ignore[arg-type]
        ("strategy", "unknown strategy 'ring'; choose one of mirrored, multi_worker_mirrored, parameter_server")
    ]


def test_it_summarises_capacity() -> None:
    hosts = [host("host-a", devices=4, used_devices=frozenset({0})), host("host-b", online=False)]
    assert capacity_summary(hosts) == {
        "hosts": 2,
        "online": 1,
        "devices": 6,
        "free_devices": 3,
        "largest_free": 3,
    }
