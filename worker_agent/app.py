"""The agent's Celery app: consumes its host's order queue and nothing else; its reports go to its own streams.

`Agent` ties one host's parts together: the app, the outbox (reports), the supervisor (task processes), the heartbeat
and the host sampler, and shuts them down in the right order.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from celery import Celery
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from celery_steps.wakeup import keep_consumer_awake
from contracts import broker
from contracts.environments import AGENT_ENVIRONMENTS, Environment, environments_from
from contracts.host_reports import HostFacts, exit_acks_from
from contracts.protocol import AGENT_ACK_EXITS, AGENT_KILL, AGENT_LAUNCH, AGENT_PING, agent_queue
from contracts.signing import Refused
from contracts.task_messages import KillOrder, LaunchSpec, kill_order_from, launch_spec_from
from kombu_redis.transport import TRANSPORT
from worker_agent import __version__, facts
from worker_agent.environments.as_task import Helper
from worker_agent.environments.known import Environments
from worker_agent.environments.venvs import Venvs
from worker_agent.heartbeat import Heartbeat
from worker_agent.orders import OrderGate
from worker_agent.outbox import Outbox
from worker_agent.sampler import DEFAULT_INTERVAL_S, Sampler
from worker_agent.supervision import Supervisor
from worker_agent.supervision.identity import UidRange

log = logging.getLogger(__name__)


class TaskRunner(Protocol):
    def launch(self, spec: LaunchSpec) -> None: ...

    def kill(self, order: KillOrder) -> None: ...

    def acknowledge_exits(self, keys: list[tuple[int, int]]) -> None: ...


def make_app(
    server: str,
    host: str,
    gate: OrderGate,
    runner: TaskRunner,
    environments: Callable[[list[Environment]], None] | None = None,
) -> Celery:
    # Not the process-wide "current" app: code that imports this (tests, tools) keeps its own default app.
    app = Celery(f"worker_agent.{host}", broker=server, set_as_current=False)
    app.conf.update(
        # Kombu's Redis transport, except that a malformed message is dropped and counted instead of stopping us.
        broker_transport=TRANSPORT,
        accept_content=["json"],
        task_serializer="json",
        # Nothing here answers `celery control` (anyone who can write the broker could stop every agent) or sends
        # events; gossip, mingle and worker heartbeats are off in run() below.
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Training processes are children of the agent itself, so the pool must not fork or recycle workers.
        worker_pool="threads",
        worker_concurrency=4,
        worker_prefetch_multiplier=1,
        # The host's broker user may touch its order queue alone (contracts/broker.py): hence also no remote control
        # (pidbox queues, pub/sub) and no events above.
        broker_transport_options=broker.transport_options(host),
    )
    keep_consumer_awake(app)  # a thread pool: orders are taken as soon as the last one is handled

    # shared=False on every task: a shared task (Celery's default) is also added to every app finalised later in the
    # process, so a second app (tests, tools) would run the first one's handlers with the first one's gate.
    @app.task(name=AGENT_PING, ignore_result=True, shared=False)
    def ping() -> str:
        return host

    @app.task(name=AGENT_LAUNCH, ignore_result=True, shared=False)
    def launch(message: Any = None) -> None:
        _carry_out(message, gate, AGENT_LAUNCH, launch_spec_from, runner.launch)

    @app.task(name=AGENT_KILL, ignore_result=True, shared=False)
    def kill(message: Any = None) -> None:
        _carry_out(message, gate, AGENT_KILL, kill_order_from, runner.kill)

    @app.task(name=AGENT_ENVIRONMENTS, ignore_result=True, shared=False)
    def set_environments(message: Any = None) -> None:
        # The cluster's task environments (orchestrator/environments/orders.py): probed by worker_agent/environments.
        if environments is not None:
            _carry_out(message, gate, AGENT_ENVIRONMENTS, environments_from, environments)

    @app.task(name=AGENT_ACK_EXITS, ignore_result=True, shared=False)
    def ack_exits(message: Any = None) -> None:
        _carry_out(message, gate, AGENT_ACK_EXITS, exit_acks_from, runner.acknowledge_exits)

    return app


def accept(message: Any, gate: OrderGate, what: str) -> dict[str, Any] | None:
    """The verified body of an orchestrator order, or None (logged) when it is unsigned, forged, for another host,
    stale, already seen or malformed.

    Anyone who can write to the broker can queue a message; only the control plane holds the key that signs orders.
    """
    try:
        return gate.admit(message, what)
    except Refused as exc:
        log.warning("refused %s: %s", what, exc)
        return None
    except OSError as exc:  # its id could not be recorded: not run (a resend comes as a new order)
        log.warning("dropping %s: cannot record it as seen: %s", what, exc)
        return None


def _carry_out(
    message: Any, gate: OrderGate, what: str, parse: Callable[[dict[str, Any]], Any], handler: Callable[[Any], None]
) -> None:
    """Check an order, read its body, hand it to the runner; anything unsigned, forged, stale, replayed or malformed
    is dropped (logged), never raised into Celery."""
    body = accept(message, gate, what)
    if body is None:
        return
    try:
        order = parse(body)
    except ValueError as exc:  # the parsers say what is malformed
        log.warning("dropping %s: %s", what, exc)
        return
    _hand_over(handler, order)


def _hand_over(handler: Any, order: Any) -> None:
    # Never raise into Celery: a failed handler would only be logged there, and the next order must still run.
    try:
        handler(order)
    except Exception:
        log.exception("handling %r failed", order)


def _with_environments(host_facts: Callable[[], HostFacts], environments: Environments) -> Callable[[], HostFacts]:
    """The host's facts with its task environments as probed now (a probe that ends shows on the next beat)."""
    return lambda: dataclasses.replace(host_facts(), environments=environments.facts())


class Agent:
    """One host's agent process: Celery consumer, outbox, supervisor, heartbeat and host sampler."""

    def __init__(
        self,
        *,
        server: str,
        host: str,
        mac_key: bytes,
        control_key: Ed25519PublicKey,
        workdir: Path,
        port_range: tuple[int, int] | None = None,
        heartbeat_interval_s: float = 3.0,
        sample_interval_s: float = DEFAULT_INTERVAL_S,
        task_uids: UidRange | None = None,
        shared_roots: list[Path] | None = None,
    ) -> None:
        self.host = host
        # The supervisor reports through the outbox, which needs the app, which needs the supervisor: the
        # supervisor gets a forwarding function, used only once the worker consumes launches.
        # `mac_key` seals every message (contracts.signing.agent_mac_key: the token stays out of this process's memory
        # once derived); `control_key` checks every order.
        self.supervisor = Supervisor(self._report, workdir, task_uids, shared_roots)
        # Task environments: the control plane's list, each probed as a helper task uid (worker_agent/environments).
        helper = Helper.of(task_uids)
        self.environments = Environments(self.supervisor.workdir, helper)
        self.supervisor.venvs = Venvs(self.supervisor.workdir, helper)
        self.app = make_app(server, host, OrderGate(control_key, host, workdir), self.supervisor, self.environments.set)
        self.outbox = Outbox(self.app, host, mac_key)
        self.heartbeat = Heartbeat(
            self.app,
            host=host,
            key=mac_key,
            interval_s=heartbeat_interval_s,
            facts=_with_environments(facts.RefreshingFacts(port_range), self.environments),
            tasks=self.supervisor.report,
        )
        self.sampler = Sampler(self.outbox.send, interval_s=sample_interval_s)
        self._shut_down = False
        self._shutdown_lock = threading.Lock()

    def _report(
        self, task_name: str, body: dict[str, Any], queue: str = broker.EVENTS, then: Callable[[], None] | None = None
    ) -> None:
        # The supervisor sends events as (name, body): the host's events stream; logs and its metrics pipes name
        # broker.METRICS; a log batch's `then` persists its output position once the batch is published.
        self.outbox.send(task_name, body, queue=queue, then=then)

    def run(self, loglevel: str = "INFO") -> int:
        """Reclaim what a previous agent left running, then consume `agent.<host>` until the worker stops
        (SIGTERM/SIGINT), then stop every task and report it."""
        # Before the hello and before any order: the hello then says "nothing runs here" truthfully (and lists what
        # was reclaimed as lost exits), and a task the orchestrator relaunches on this host cannot collide with its
        # orphan on the same port.
        reclaimed = self.supervisor.reclaim()
        if reclaimed:
            log.warning("reclaimed %d task(s) a previous agent left behind", len(reclaimed))
        self.environments.start()  # what it was told last time is reported once probed (cached per interpreter)
        self.heartbeat.start()
        self.sampler.start()
        log.info("agent %s for host %s consuming %s", __version__, self.host, agent_queue(self.host))
        worker = self.app.Worker(
            hostname=f"agent@{self.host}",
            queues=[agent_queue(self.host)],
            loglevel=loglevel,
            without_gossip=True,
            without_mingle=True,
            without_heartbeat=True,
            quiet=True,
        )
        try:
            worker.start()
        finally:
            self.shutdown()
        return worker.exitcode or 0

    def shutdown(self) -> None:
        """Kill every task (TF would outlive us: its own session, SIGTERM ignored), then deliver the EXITED events."""
        with self._shutdown_lock:
            if self._shut_down:
                return
            self._shut_down = True
        self.heartbeat.stop()
        self.environments.stop()
        self.sampler.stop()  # hands its last samples to the outbox, flushed below
        running = self.supervisor.running()
        if running:
            log.info("agent shutting down: killing %d task(s)", len(running))
        self.supervisor.kill_all("agent shutting down")
        if self.outbox.flush(5):
            log.info("agent stopped: outbox flushed (%d message(s) sent)", self.outbox.sent)
        else:
            log.warning("agent stopped with %d unsent message(s): broker unreachable", self.outbox.pending())
        self.outbox.stop()
