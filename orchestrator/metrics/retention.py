"""Retention: host samples older than TFDASH_SAMPLES_FULL_S (a day) are thinned to one per TFDASH_SAMPLES_THIN_S
(a minute) per host, the earliest of each minute kept. Run by Celery beat (`orchestrator.retention`).

Bounded work per run: each host is walked from its watermark (`Host.samples_thinned_to`, everything below it already
thinned) towards the cutoff, an hour of samples at a time, each hour one DELETE of at most TFDASH_RETENTION_BATCH
rows; a run stops once it has deleted that many. The watermark moves past an hour only once the hour is done, in the
same transaction as its delete, so a run cut short (or two racing) redoes at most one hour, and a second run over the
same hours deletes nothing: idempotent. Thinned history is never scanned again.
"""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from django.db import connection, transaction

from orchestrator.models import Host, HostSample

log = logging.getLogger(__name__)

HOURS_PER_STEP = 1  # buckets examined per statement: 60 buckets (an hour at one a minute)


def thin_host_samples(now: float | None = None) -> int:
    """One bounded pass over every host; returns how many samples it deleted."""
    now = time.time() if now is None else now
    thin_s = settings.TFDASH_SAMPLES_THIN_S
    # Aligned to buckets, so a bucket is never split between a thinned part and a kept part.
    cutoff = math.floor((now - settings.TFDASH_SAMPLES_FULL_S) / thin_s) * thin_s
    budget = settings.TFDASH_RETENTION_BATCH
    deleted = 0
    for host_id, watermark in Host.objects.order_by("pk").values_list("pk", "samples_thinned_to"):
        thinned_to = watermark
        while deleted < budget:
            # Jump over gaps (a host off for a week): the next sample above the watermark, by the (host, ts) index.
            first = (
                HostSample.objects.filter(host_id=host_id, ts__gte=thinned_to, ts__lt=cutoff)
                .order_by("ts")
                .values_list("ts", flat=True)
                .first()
            )
            if first is None:
                break
            start = math.floor(first / thin_s) * thin_s
            end = min(cutoff, start + thin_s * 60 * HOURS_PER_STEP)
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(_THIN_SQL, [thin_s, host_id, start, end, budget - deleted])
                    done = cursor.rowcount
                deleted += done
                if deleted < budget:  # the hour is thinned whole: never look at it again
                    Host.objects.filter(pk=host_id).update(samples_thinned_to=end)
                    thinned_to = end
    if deleted:
        log.info("retention: thinned %d host samples older than %.0f", deleted, cutoff)
    return deleted


# Every sample of the host in [start, end) but the earliest of its bucket, at most the given number.
_THIN_SQL = f"""
    DELETE FROM {HostSample._meta.db_table} WHERE id IN (
        SELECT id FROM (
            SELECT id, row_number() OVER (PARTITION BY floor(ts / %s) ORDER BY ts, id) AS n
            FROM {HostSample._meta.db_table} WHERE host_id = %s AND ts >= %s AND ts < %s
        ) bucketed WHERE n > 1 LIMIT %s
    )
"""  # noqa: S608 - the table name is the model's; values are parameters
