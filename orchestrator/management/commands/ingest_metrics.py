"""Run one partition of the metrics ingest: the consumer of its share of the hosts' metric streams (see
orchestrator/metrics/stream.py; TFDASH_INGEST_PARTITIONS processes, one per --partition)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.metrics.stream import MetricsConsumer
from orchestrator.plumbing.gc_pause import freeze_startup_heap

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Store agents' metric points, host samples and artifacts as they arrive, and push them to open pages."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--consumer", default="", help="the consumer name in the stream's group (default ingest-P)")
        parser.add_argument("--partition", type=int, default=0, help="which of TFDASH_INGEST_PARTITIONS (from 0)")

    def handle(self, *args: Any, consumer: str, partition: int, **options: Any) -> None:
        partitions = settings.TFDASH_INGEST_PARTITIONS
        if not 0 <= partition < partitions:
            raise CommandError(
                f"--partition {partition}: TFDASH_INGEST_PARTITIONS is {partitions} (0 to {partitions - 1})"
            )
        consumer = consumer or f"ingest-{partition}"
        freeze_startup_heap()
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
        ingest = MetricsConsumer(client, consumer=consumer, partition=partition, partitions=partitions)
        self.stdout.write(f"metrics ingest {consumer} ready (partition {partition} of {partitions})", ending="\n")
        self.stdout.flush()
        ingest.run(stop)
        s = ingest.stored
        log.info("ingest stopped: %d entries, %d points, %d samples, %d artifacts stored, %d dropped, %d dead-lettered",
                 ingest.entries, s.points, s.samples, s.artifacts, s.dropped, ingest.dead)  # fmt: skip
