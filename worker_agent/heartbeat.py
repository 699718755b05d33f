"""A thread that says hello once, then reports the host's facts every few seconds.

Every report (hello and heartbeat) also carries the agent's task report: what runs here, the exits not yet
acknowledged and its last event number, from which the orchestrator converges its view of the host on every beat
(orchestrator/agents/reconcile.py).

The hello is an entry of the host's events stream, each heartbeat after it one of its heartbeats stream
(contracts/broker.py, contracts/protocol.py), which the orchestrator reads in batches.

It survives a broker outage: a failed send is logged and the next tick tries again, so a host turns `online` again
by itself once Redis is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis
from celery import Celery

from contracts import broker
from contracts.host_reports import HostFacts, HostReport, TaskReport
from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO, STREAM_MAXLEN, stream_entry
from contracts.signing import seal
from worker_agent.outbox import broker_redis

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(
        self,
        app: Celery,
        *,
        host: str,
        key: bytes,
        interval_s: float,
        facts: Callable[[], HostFacts],
        tasks: Callable[[], TaskReport] | None = None,
        stream: redis.Redis | None = None,
    ) -> None:
        """`stream`: where heartbeats are added (the broker's Redis unless given)."""
        super().__init__(name="heartbeat", daemon=True)
        self.app = app
        self.host = host
        self._key = key  # the host's MAC key (contracts.signing.agent_mac_key), never the token
        self.interval_s = interval_s
        self.facts = facts
        self.tasks = tasks
        self.stopped = threading.Event()
        self.sent = 0
        self._redis = stream

    def run(self) -> None:
        hello_pending = True
        while not self.stopped.is_set():
            name = AGENT_HELLO if hello_pending else AGENT_HEARTBEAT
            if self.send(name):
                hello_pending = False
            self.stopped.wait(self.interval_s)

    def send(self, name: str) -> bool:
        tasks = self.tasks() if self.tasks is not None else None
        report = HostReport(facts=self.facts(), tasks=tasks)
        try:
            sealed = seal(self._key, self.host, name, report.to_body())
            # A hello waits its turn in the events stream (task events may be behind it); a heartbeat goes to a
            # stream of its own, capped short: only a fresh one says anything.
            kind = broker.EVENTS if name == AGENT_HELLO else broker.HEARTBEATS
            self._stream().xadd(
                broker.stream(self.host, kind), stream_entry(name, sealed), maxlen=STREAM_MAXLEN[kind], approximate=True
            )
        except Exception as exc:  # broker down: keep beating, the next tick retries
            log.warning("could not send %s: %s", name, exc)
            return False
        self.sent += 1
        return True

    def _stream(self) -> redis.Redis:
        if self._redis is None:
            self._redis = broker_redis(self.app)
        return self._redis

    def stop(self) -> None:
        self.stopped.set()
