"""The URL of a test database, for the processes a test starts itself (a control plane, an ingest): they read
DATABASE_URL as a deployment does, and must reach the database pytest-django made for this worker."""

from __future__ import annotations

from urllib.parse import quote

from django.db import DEFAULT_DB_ALIAS, connections


def database_url(alias: str = DEFAULT_DB_ALIAS) -> str:
    db = connections[alias].settings_dict
    auth = quote(db["USER"] or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
