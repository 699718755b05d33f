from __future__ import annotations

import json

import pytest

from contracts.strategies import Strategy
from orchestrator.core.assignment import TaskPlacement
from orchestrator.core.hosts import HostState
from orchestrator.core.placement import Placement, place
from orchestrator.core.shapes import JobShape
from orchestrator.core.tf_config import cluster_spec, task_environment, tf_config_for, tf_config_texts, tf_configs_for

PS = Strategy.PARAMETER_SERVER
MWMS = Strategy.MULTI_WORKER_MIRRORED


def host(name: str, address: str, devices: int = 2) -> HostState:
    return HostState(
        name=name,
        address=address,
        port_min=23000,
        port_max=23009,
        device_ids=tuple(range(devices)),
        gpu=False,
        labels=frozenset(),
        online=True,
        used_devices=frozenset(),
        used_ports=frozenset(),
    )


def ps_placement() -> Placement:
    hosts = [host("host-a", "127.0.0.2"), host("host-b", "127.0.0.3"), host("host-c", "127.0.0.4")]
    result = place(JobShape(PS, 3, 2, 1), hosts)
    assert isinstance(result, Placement), result
    return result


def test_it_builds_identical_cluster_specs_for_every_ps_task() -> None:
    placement = ps_placement()
    configs = [tf_config_for(placement, t, PS) for t in placement.tasks]
    clusters = [c["cluster"] for c in configs if c is not None]
    assert len(clusters) == 6
    assert all(c == clusters[0] for c in clusters)
    assert {role: len(endpoints) for role, endpoints in clusters[0].items()} == {
        "chief": 1,
        "worker": 3,
        "ps": 2,
    }
    endpoints = [e for role in clusters[0].values() for e in role]
    assert len(set(endpoints)) == len(endpoints)


def test_the_texts_a_pass_stores_are_the_tf_configs() -> None:
    """The scheduler stores each task's TF_CONFIG from text serialized with the job's cluster once: the same JSON,
    for every strategy (none for a one-process run), IPv6 brackets included."""
    hosts = [host("host-a", "127.0.0.2"), host("host-b", "::1"), host("host-c", "10.0.0.9")]
    for strategy, shape in (
        (PS, JobShape(PS, 3, 2, 1)),
        (MWMS, JobShape(MWMS, 3, 0, 2)),
        (Strategy.MIRRORED, JobShape(Strategy.MIRRORED, 1, 0, 2)),
    ):
        placement = place(shape, hosts)
        assert isinstance(placement, Placement), placement
        texts = tf_config_texts(placement, strategy)
        parsed = {key: None if text is None else json.loads(text) for key, text in texts.items()}
        assert parsed == tf_configs_for(placement, strategy)


def test_it_gives_each_role_indexes_from_zero() -> None:
    placement = ps_placement()
    tasks = [c["task"] for t in placement.tasks if (c := tf_config_for(placement, t, PS)) is not None]
    for role, count in {"chief": 1, "worker": 3, "ps": 2}.items():
        assert sorted(t["index"] for t in tasks if t["type"] == role) == list(range(count))


def test_it_lists_endpoints_by_index_and_omits_empty_roles() -> None:
    placement = Placement(
        (
            TaskPlacement("worker", 1, "host-b", "10.0.0.2", 23000, (0,)),
            TaskPlacement("worker", 0, "host-a", "10.0.0.1", 23000, (0,)),
        )
    )
    assert cluster_spec(placement) == {"worker": ["10.0.0.1:23000", "10.0.0.2:23000"]}


def test_it_brackets_ipv6_addresses() -> None:
    placement = Placement((TaskPlacement("worker", 0, "host-a", "fd00::1", 23000, (0,)),))
    assert cluster_spec(placement) == {"worker": ["[fd00::1]:23000"]}


def test_it_rejects_gaps_in_a_roles_indexes() -> None:
    placement = Placement(
        (
            TaskPlacement("worker", 0, "host-a", "10.0.0.1", 23000, (0,)),
            TaskPlacement("worker", 2, "host-b", "10.0.0.2", 23000, (0,)),
        )
    )
    with pytest.raises(ValueError, match=r"worker indexes must be 0\.\.1"):
        cluster_spec(placement)


def test_it_rejects_a_task_from_another_placement() -> None:
    stranger = TaskPlacement("worker", 0, "host-z", "10.0.0.9", 23000, (0,))
    with pytest.raises(ValueError, match="not part of this placement"):
        tf_config_for(ps_placement(), stranger, PS)


def test_it_gives_mirrored_no_tf_config() -> None:
    result = place(JobShape(Strategy.MIRRORED, 1, 0, 2), [host("host-a", "127.0.0.2")])
    assert isinstance(result, Placement)
    task = result.tasks[0]
    assert tf_config_for(result, task, Strategy.MIRRORED) is None
    assert task_environment(result, task, Strategy.MIRRORED) == {"TF_USE_LEGACY_KERAS": "1"}


def test_it_sets_grpc_fail_fast_in_every_ps_task() -> None:
    placement = ps_placement()
    for task in placement.tasks:
        env = task_environment(placement, task, PS)
        assert env["GRPC_FAIL_FAST"] == "use_caller"
        assert env["TF_USE_LEGACY_KERAS"] == "1"
        assert json.loads(env["TF_CONFIG"]) == tf_config_for(placement, task, PS)
        assert "CUDA_VISIBLE_DEVICES" not in env


def test_it_leaves_grpc_fail_fast_and_legacy_keras_out_of_mwms_when_asked() -> None:
    result = place(JobShape(MWMS, 2, 0, 1), [host("host-a", "10.0.0.1"), host("host-b", "10.0.0.2")])
    assert isinstance(result, Placement)
    env = task_environment(result, result.tasks[1], MWMS, legacy_keras=False)
    assert set(env) == {"TF_CONFIG"}
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["10.0.0.1:23000", "10.0.0.2:23000"]},
        "task": {"type": "worker", "index": 1},
    }


def test_it_writes_tf_configs_that_tensorflow_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    tf = pytest.importorskip("tensorflow")
    placement = ps_placement()
    expected = cluster_spec(placement)
    for task in placement.tasks:
        monkeypatch.setenv("TF_CONFIG", task_environment(placement, task, PS)["TF_CONFIG"])
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert resolver.cluster_spec().as_dict() == expected
        assert (resolver.task_type, resolver.task_id) == (task.type, task.index)
