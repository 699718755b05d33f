"""The PostgreSQL and Redis addresses a two-machine control plane may be given (docs/operations/two-control-planes.md):
a libpq multi-host DATABASE_URL reaches whichever listed server answers and takes writes; a Redis Sentinel URL, which
the product's own Redis clients cannot follow, is refused at start with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import quote

import pytest
from django.db import connection

from tests.support.processes import ROOT

PROBE = """
import django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT pg_is_in_recovery()")
    print(connection.connection.info.host, cursor.fetchone()[0], connection.settings_dict["OPTIONS"])
"""


def _run(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.django_db
def test_a_multi_host_database_url_reaches_the_server_that_answers_and_takes_writes() -> None:
    db = connection.settings_dict
    real = db["HOST"] or "127.0.0.1"
    auth = quote(db["USER"] or "") + (":" + quote(db["PASSWORD"]) if db.get("PASSWORD") else "")
    # libpq's host list (comma, quoted in the URL's host part), tried in order: the first name resolves to nothing.
    hosts = quote(f"tfdash-primary-gone.invalid,{real}", safe="")
    url = (
        f"postgres://{auth}@{hosts}:{db['PORT'] or 5432}/{db['NAME']}?target_session_attrs=read-write&connect_timeout=5"
    )
    done = _run(DATABASE_URL=url)
    assert done.returncode == 0, done.stderr[-3000:]
    host, in_recovery, options = done.stdout.split(" ", 2)
    assert host == real and in_recovery == "False"
    assert "'target_session_attrs': 'read-write'" in options


def test_a_sentinel_redis_url_is_refused_with_the_reason() -> None:
    done = _run(REDIS_URL="sentinel://sentinel-1:26379/0")
    assert done.returncode != 0
    assert "REDIS_URL must be a redis://, rediss:// or unix:// URL, not sentinel://" in done.stderr
    assert "two-control-planes.md" in done.stderr
