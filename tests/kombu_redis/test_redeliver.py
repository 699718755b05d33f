"""Taking back what a dead consumer took (kombu_redis/redeliver.py), with real Redis: the unacknowledged messages of the
named queues go back on their queue at once, those of other queues stay where they are, and a transport that keeps
no such hash is left alone."""

from __future__ import annotations

import uuid

import kombu
import pytest
import redis
from kombu.transport import redis as kombu_transport

from kombu_redis import redeliver, transport


def test_the_unacknowledged_messages_of_the_named_queues_go_back_and_no_others(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = uuid.uuid4().hex[:8]
    mine, other = f"redeliver-mine-{run}", f"redeliver-other-{run}"
    # Its own unacknowledged set (the default one is shared by every consumer of this Redis database).
    options = {"unacked_key": f"{run}:unacked", "unacked_index_key": f"{run}:index"}
    client = redis.Redis.from_url(redis_url)
    try:
        with kombu.Connection(redis_url, transport=transport.TRANSPORT, transport_options=options) as conn:
            with conn.Producer() as producer:
                for queue in (mine, other):
                    kombu.Queue(queue, routing_key=queue)(conn.default_channel).declare()
                    producer.publish({"to": queue}, routing_key=queue, serializer="json")
            # A consumer that dies (SIGKILL) puts nothing back, as one that closes its channel does.
            monkeypatch.setattr(kombu_transport.QoS, "restore_unacked_once", lambda self, stderr=None: None)
            for queue in (mine, other):  # taken, and the consumer dies before acknowledging them
                consumer = conn.SimpleQueue(queue, no_ack=False)
                assert consumer.get(timeout=5).payload == {"to": queue}
                consumer.close()
            assert client.llen(mine) == client.llen(other) == 0
            assert client.hlen(f"{run}:unacked") == 2
        monkeypatch.undo()

        with kombu.Connection(redis_url, transport=transport.TRANSPORT, transport_options=options) as conn:
            assert redeliver.restore_unacked(conn, [mine]) == 1

        assert client.llen(mine) == 1  # back on its queue, for the next consumer
        assert client.llen(other) == 0 and client.hlen(f"{run}:unacked") == 1  # another worker's queue: left alone
    finally:
        client.delete(mine, other, f"{run}:unacked", f"{run}:index")


def test_a_transport_without_an_unacknowledged_hash_is_left_alone() -> None:
    with kombu.Connection("memory://") as conn:
        assert redeliver.restore_unacked(conn, ["orchestrator"]) == 0
