"""The control plane's sends (orchestrator/plumbing/broker_sends.py) with the real broker: a pooled connection that
Kombu left holding a closed channel (what a publish cut short by Redis going away leaves behind) fails as a broker
error, which every caller handles, and the send after it goes through on a fresh connection, instead of every later send
of the process failing with AttributeError."""

from __future__ import annotations

import pytest
import redis

from config.celery import app
from contracts.protocol import agent_queue
from orchestrator.plumbing import broker_sends


@pytest.fixture
def queue(redis_url):  # type: ignore[no-untyped-def]
    name = agent_queue("broker-sends-test")
    client = redis.Redis.from_url(redis_url)
    client.delete(name)
    yield name, client
    client.delete(name)


def test_a_pooled_connection_with_a_closed_channel_fails_as_a_broker_error_and_the_next_send_goes_through(queue):
    name, client = queue
    broker_sends.send("orchestrator.noop", [1], name)
    held = [app.pool.acquire(block=True) for _ in range(app.pool.limit)]
    for connection in held:  # as Kombu's transport leaves them: the channel closed, still the connection's default
        connection.transport.close_channel(connection.default_channel)
        connection.release()

    with pytest.raises(broker_sends.BROKER_ERRORS):
        broker_sends.send("orchestrator.noop", [2], name)
    broker_sends.send("orchestrator.noop", [3], name)
    broker_sends.send("orchestrator.noop", [4], name)

    assert client.llen(name) == 3  # the first send and the two after the pools were dropped


def test_an_attribute_error_of_our_own_is_not_taken_for_the_broker(queue, monkeypatch):
    name, _client = queue

    def buggy(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise AttributeError("'Order' object has no attribute 'body'")

    monkeypatch.setattr(app, "send_task", buggy)
    with pytest.raises(AttributeError):
        broker_sends.send("orchestrator.noop", [1], name)
