"""The agent's order gate: a signed, fresh order for this host is admitted once, across the agent's restarts too
(seen ids live in its workdir), and the record keeps only what could still be fresh."""

from __future__ import annotations

import json
import stat
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts import signing
from contracts.signing import Refused, sign_order
from worker_agent.orders import SEEN_FILE, OrderGate, SeenOrders

CONTROL = Ed25519PrivateKey.generate()


def test_an_order_is_admitted_once_and_a_restarted_gate_remembers_it(tmp_path):
    order = sign_order(CONTROL, "gpu-1", "agent.kill", {"task_id": 1})
    gate = OrderGate(CONTROL.public_key(), "gpu-1", tmp_path)

    assert gate.admit(order, "agent.kill") == {"task_id": 1}
    with pytest.raises(Refused) as again:
        gate.admit(order, "agent.kill")
    restarted = OrderGate(CONTROL.public_key(), "gpu-1", tmp_path)  # the agent's next life, same workdir
    with pytest.raises(Refused) as after_restart:
        restarted.admit(order, "agent.kill")

    assert again.value.reason == after_restart.value.reason == signing.REPLAYED
    assert stat.S_IMODE((tmp_path / SEEN_FILE).stat().st_mode) == 0o600


def test_seen_ids_are_kept_only_while_their_order_could_be_fresh(tmp_path):
    seen = SeenOrders(tmp_path)
    now = time.time()
    assert seen.first_time("old", now + 1, now=now)
    assert seen.first_time("new", now + 100, now=now)

    assert seen.first_time("later", now + 200, now=now + 50)  # "old" turned stale meanwhile: forgotten

    assert set(json.loads((tmp_path / SEEN_FILE).read_text())) == {"new", "later"}
    assert not seen.first_time("new", now + 100, now=now + 60)


def test_a_broken_record_starts_empty_without_crashing_the_agent(tmp_path):
    (tmp_path / SEEN_FILE).write_text("{not json")

    assert len(SeenOrders(tmp_path)) == 0
