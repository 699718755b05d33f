"""A host's broker identity, one definition both sides read (contracts/broker.py)."""

from __future__ import annotations

import hashlib

import pytest

from contracts import broker
from contracts.signing import agent_mac_key


def test_every_key_of_a_host_is_under_its_prefix_and_names_it():
    for key in (broker.order_queue("gpu-1"), *(broker.stream("gpu-1", kind) for kind in broker.STREAM_KINDS)):
        assert key.startswith(broker.key_prefix("gpu-1"))
        assert broker.host_of_key(key) == "gpu-1"
    assert broker.host_of_key(broker.order_queue("gpu-1") + "\x06\x163") == "gpu-1"  # Kombu's priority lists
    assert broker.host_of_key("orchestrator") == ""
    assert broker.host_of_key("x:tfdash:host:gpu-1:orders") == ""
    with pytest.raises(ValueError, match="no stream kind"):
        broker.stream("gpu-1", "orders")


def test_the_password_is_bound_to_the_host_and_its_key_and_redis_keeps_only_its_digest():
    key = agent_mac_key("tfa_t", "gpu-1")
    password = broker.password(key, "gpu-1")
    assert password == broker.password(key, "gpu-1")
    assert password != broker.password(key, "gpu-2")
    assert password != broker.password(agent_mac_key("tfa_other", "gpu-1"), "gpu-1")
    rules = broker.acl_rules("gpu-1", password)
    assert rules[:2] == ["reset", "on"]
    assert f"#{hashlib.sha256(password.encode()).hexdigest()}" in rules
    assert password not in " ".join(rules)
    assert "~tfdash:host:gpu-1:*" in rules and "resetchannels" in rules and "-@all" in rules


def test_an_agents_url_signs_in_as_its_host_and_refuses_a_url_that_carries_credentials():
    url = broker.server_url("redis://broker.lan:6379/0", "gpu-1", "pw")
    assert url == "redis://host-gpu-1:pw@broker.lan:6379/0"
    with pytest.raises(ValueError, match="no user or password"):
        broker.server_url("redis://tfdash:secret@broker.lan:6379/0", "gpu-1", "pw")
    with pytest.raises(ValueError, match="redis://"):
        broker.server_url("http://broker.lan/", "gpu-1", "pw")
    assert broker.without_credentials("redis://tfdash:secret@127.0.0.1:16379/0") == "redis://127.0.0.1:16379/0"
    assert broker.without_credentials("rediss://u:p@[::1]:6380/2") == "rediss://[::1]:6380/2"
