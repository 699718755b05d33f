"""A thread-pool worker takes its next message as soon as it has handled the last one (celery_steps/wakeup.py).

A real Celery worker with the project's transport, `--pool threads`, one thread, a prefetch count of one and
acknowledgement after the handler (as the orchestrator and the agents run): without the tick its consumer loop sleeps
after each message until its next timer (up to 10 s: celery/celery#6941), so 40 messages took minutes; with it they
are all handled within the wait below, with room to spare on a loaded machine.
"""

from __future__ import annotations

import threading
import uuid

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_steps.wakeup import KeepAwake, keep_consumer_awake
from kombu_redis.transport import TRANSPORT
from tests.support.processes import wait_until

MESSAGES = 40


def _app(redis_url: str, queue: str) -> Celery:
    app = Celery(f"wakeup-test-{queue}", broker=redis_url, set_as_current=False)
    app.conf.update(
        broker_transport=TRANSPORT,
        # Its own unacknowledged set: the default one is shared by every consumer of this Redis database.
        broker_transport_options={"unacked_key": f"{queue}:unacked", "unacked_index_key": f"{queue}:index"},
        accept_content=["json"],
        task_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        task_default_queue=queue,
    )
    return app


def test_a_thread_pool_worker_takes_each_message_as_soon_as_the_last_is_handled(redis_url: str) -> None:
    queue = f"wakeup-{uuid.uuid4().hex[:8]}"
    app = _app(redis_url, queue)
    keep_consumer_awake(app)
    assert KeepAwake in app.steps["consumer"]
    handled: list[int] = []
    lock = threading.Lock()

    @app.task(name="wakeup.note", shared=False)
    def note(i: int) -> None:
        with lock:
            handled.append(i)

    try:
        with app.producer_or_acquire() as producer:
            for i in range(MESSAGES):
                note.apply_async((i,), producer=producer)
        with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, shutdown_timeout=10):
            # Without the tick: one message per timer period of the consumer loop (several seconds each).
            wait_until(lambda: len(handled) == MESSAGES, timeout=30, what=f"{MESSAGES} messages handled")
        assert sorted(handled) == list(range(MESSAGES))
    finally:
        redis.Redis.from_url(redis_url).delete(queue, f"{queue}:unacked", f"{queue}:index")
