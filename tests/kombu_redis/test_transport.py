"""One bad message never stops a consumer: junk on a Celery queue is dropped, logged and counted, and the next good
message is handled (kombu_redis/transport.py).

First against Kombu alone (a consumer on a queue of its own, the real Redis), then the real thing: the session's
orchestrator worker and a real agent get junk on their queues, stay up, and a job submitted afterwards succeeds.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import uuid
from typing import Any

import kombu
import kombu.transport.redis
import pytest
import redis
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from config.celery import app
from contracts import broker
from contracts.protocol import MAX_ENTRY_BYTES, ORCHESTRATOR_QUEUE, TASK_EVENT, agent_queue
from kombu_redis import transport
from orchestrator.models import Host, HostStatus, Job, TaskLogLine
from orchestrator.plumbing import counters, streams
from orchestrator.tasks import BROKER_MESSAGES_DROPPED
from tests import factories
from tests.support.processes import wait_until
from tests.support.wire import sealed


def _envelope(**changes: Any) -> dict[str, Any]:
    """A Kombu envelope as the Redis transport stores it, with `changes` on top."""
    return {
        "body": "e30=",  # base64 of "{}"
        "content-type": "application/json",
        "content-encoding": "utf-8",
        "headers": {},
        "properties": {
            "delivery_tag": uuid.uuid4().hex,
            "body_encoding": "base64",
            "delivery_info": {"exchange": "", "routing_key": "q"},
        },
        **changes,
    }


# What anyone who can write a queue could put there; before kombu_redis/transport.py each of these stopped a worker.
JUNK: list[bytes] = [
    b"not json",
    b"\xff\xfe not utf-8",
    b"[" * 100_000,  # nested past the parser's depth
    b"[]",
    b"{}",
    b'"text"',
    b'{"body": 1}',
    b'{"properties": {}}',
    b'{"properties": {"delivery_tag": "t1"}}',
    b'{"__type__": "decimal", "__value__": "not a number"}',
    json.dumps(_envelope(properties={"delivery_tag": {"a": 1}, "delivery_info": {}})).encode(),
    json.dumps(_envelope(headers="not an object")).encode(),
    json.dumps(_envelope(headers={"task": "x" * (transport.MAX_HEADERS_CHARS + 1)})).encode(),
    json.dumps(_envelope(body=12)).encode(),
]


def test_the_overridden_methods_are_the_ones_of_the_pinned_kombu() -> None:
    # A Kombu upgrade that changes Channel._brpop_read or _put must be looked at: kombu_redis/transport.py copies
    # the one's body and the other's key and body.
    assert kombu.__version__ == "5.5.4"
    for method, digest in ((kombu.transport.redis.Channel._brpop_read, transport.UPSTREAM_BRPOP_READ_SHA256),
                           (kombu.transport.redis.Channel._put, transport.UPSTREAM_PUT_SHA256)):  # fmt: skip
        assert hashlib.sha256(inspect.getsource(method).encode()).hexdigest() == digest, method


def test_a_consumer_drops_junk_and_takes_the_next_good_message(redis_url: str) -> None:
    name = f"junk-test-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    received: list[Any] = []
    before = transport.dropped()
    oversized = b'{"padding": "' + b"x" * 200_000 + b'"}'
    # A body that is not JSON under an envelope that is: Kombu's consumer raises decoding it, after the message
    # entered the unacknowledged set; it must leave it again, or it would be put back on the queue and met again.
    undecodable = json.dumps(_envelope(body="bm90IGpzb24=")).encode()  # base64 of "not json"
    try:
        # Its own unacknowledged set (the default one is shared by every consumer of this Redis database).
        options = {"max_message_bytes": 200_000, "unacked_key": f"{name}:unacked", "unacked_index_key": f"{name}:index"}
        with kombu.Connection(redis_url, transport=transport.TRANSPORT, transport_options=options) as conn:
            queue = kombu.Queue(name, routing_key=name)

            def on_message(body: Any, message: Any) -> None:
                received.append(body)
                message.ack()

            with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
                for junk in [*JUNK, oversized, undecodable]:
                    client.lpush(name, junk)
                with conn.Producer() as producer:
                    producer.publish({"good": 1}, routing_key=name, serializer="json")
                wait_until(lambda: _drained(conn, received), timeout=10, what="the good message")

        assert received == [{"good": 1}]
        assert transport.dropped() - before == len(JUNK) + 2
        assert client.llen(name) == 0
        assert client.hlen(f"{name}:unacked") == 0  # nothing left to be put back on the queue later
    finally:
        client.delete(name, f"{name}:unacked", f"{name}:index")


def test_publishes_in_a_batch_arrive_in_order_when_it_ends_and_none_when_it_raises(redis_url: str) -> None:
    name = f"batch-test-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    received: list[Any] = []
    try:
        with kombu.Connection(redis_url, transport=transport.TRANSPORT) as conn:
            queue = kombu.Queue(name, routing_key=name)
            with conn.Producer() as producer:
                with producer.channel.batched_puts():
                    for n in range(3):
                        producer.publish({"n": n}, routing_key=name, serializer="json")
                    assert client.llen(name) == 0  # held until the block ends
                assert client.llen(name) == 3
                with pytest.raises(RuntimeError), producer.channel.batched_puts():
                    producer.publish({"n": 99}, routing_key=name, serializer="json")
                    raise RuntimeError("the caller failed half way")
                producer.publish({"n": 3}, routing_key=name, serializer="json")  # one by one again after a batch

            def on_message(body: Any, message: Any) -> None:
                received.append(body)
                message.ack()

            with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
                wait_until(lambda: _drained(conn, received) and len(received) == 4, timeout=10, what="the messages")
        assert received == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]
    finally:
        client.delete(name)


def _drained(conn: kombu.Connection, received: list[Any]) -> bool:
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=0.2)
    return bool(received)


# --- the real processes ----------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_junk_on_every_queue_and_stream_the_control_plane_reads_stops_nobody(
    orchestrator, start_agent, alice, redis_url
):
    host, token = factories.host("junk-0", port_min=27800)
    Host.objects.filter(pk=host.pk).update(port_max=27809, cpu_slots=2)
    agent = start_agent(host.name, token)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, timeout=30, what="the host online")
    client = redis.Redis.from_url(redis_url)
    before = counters.get(BROKER_MESSAGES_DROPPED)
    huge = b"x" * (transport.MAX_MESSAGE_BYTES + 1)

    for queue in (ORCHESTRATOR_QUEUE, agent_queue(host.name)):
        for junk in [*JUNK, huge]:
            client.lpush(queue, junk)
    # And the host's own streams, which the orchestrator's readers and the ingest read
    # (orchestrator/plumbing/streams.py): not JSON, the wrong shape, a name no reader knows, another host's envelope,
    # over the bound.
    other = sealed("junk-other", "tfa_x", TASK_EVENT, {})
    stream_junk = [
        {"name": TASK_EVENT, "envelope": "{not json"},
        {"name": TASK_EVENT, "envelope": "[1, 2]"},
        {"envelope": "{}"},
        {"name": "orchestrator.launch", "envelope": json.dumps(sealed(host.name, token, "orchestrator.launch", [1]))},
        {"name": TASK_EVENT, "envelope": json.dumps(other)},
        {"name": TASK_EVENT, "envelope": b"x" * (MAX_ENTRY_BYTES + 1)},
    ]
    dead_before = sum(counters.get(streams.dead_letter_counter(kind)) for kind in broker.STREAM_KINDS)
    for kind in broker.STREAM_KINDS:
        for junk in stream_junk:
            client.xadd(broker.stream(host.name, kind), junk)

    def all_dropped() -> bool:
        assert orchestrator.proc.poll() is None, "the orchestrator exited"
        assert agent.proc.poll() is None, "the agent exited"
        return counters.get(BROKER_MESSAGES_DROPPED) - before >= len(JUNK) + 1

    wait_until(all_dropped, timeout=30, what="the orchestrator to drop every junk message")
    wait_until(
        lambda: (
            sum(counters.get(streams.dead_letter_counter(kind)) for kind in broker.STREAM_KINDS) - dead_before
            # All but three: "[1, 2]" on the events and metrics streams and a report name the ingest does not know reach
            # a handler that refuses them as it refuses any bad message (logged, counted), without a dead letter.
            >= len(stream_junk) * len(broker.STREAM_KINDS) - 3
        ),
        timeout=30,
        what="the readers to set the stream junk aside",
    )
    agent.wait_for_line(
        rf"dropped a malformed message from queue {agent_queue(host.name)} .*; {len(JUNK) + 1} dropped", 30
    )
    # The log line shows the start of what was dropped, never all of it.
    dropped_lines = [line for line in agent.output().splitlines() if "dropped a malformed message" in line]
    assert len(dropped_lines) == len(JUNK) + 1
    assert max(len(line) for line in dropped_lines) < 1000

    api = APIClient()
    api.force_authenticate(alice)
    script = SimpleUploadedFile("after.py", b"print('after the junk', flush=True)\n")
    response = api.post(
        "/api/jobs/",
        {"name": "after", "strategy": "mirrored", "workers": 1, "devices_per_worker": 1, "script": script},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    job = wait_until(
        lambda: (j := Job.objects.get(pk=response.json()["id"])).is_terminal and j, timeout=60, what="the job to end"
    )
    assert job.state == "succeeded", job.reason
    # Its line stored: the ingest read past the junk too.
    wait_until(lambda: TaskLogLine.objects.filter(task__job=job, text="after the junk").exists(), 30, what="its line")
    assert orchestrator.proc.poll() is None
    assert agent.proc.poll() is None
    # Nor does `celery control` reach them (`shutdown` from anyone who can write the broker): nobody answers a ping.
    assert app.control.ping(timeout=2.0) == []
