"""Run the metrics ingest: the one consumer of the hosts' metric streams (see orchestrator/metrics/stream.py)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from orchestrator.metrics.stream import MetricsConsumer

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Store agents' metric points, host samples and artifacts as they arrive, and push them to open pages."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--consumer", default="ingest", help="the consumer name in the stream's group")

    def handle(self, *args: Any, consumer: str, **options: Any) -> None:
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        # Reads never block; keepalive and health checks notice a Redis that went away.
        client = redis.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=10,
            socket_connect_timeout=5,
            socket_keepalive=True,
            health_check_interval=15,
        )
        ingest = MetricsConsumer(client, consumer=consumer)
        self.stdout.write(f"metrics ingest {consumer} ready", ending="\n")
        self.stdout.flush()
        ingest.run(stop)
        s = ingest.stored
        log.info("ingest stopped: %d entries, %d points, %d samples, %d artifacts stored, %d dropped, %d dead-lettered",
                 ingest.entries, s.points, s.samples, s.artifacts, s.dropped, ingest.dead)  # fmt: skip
