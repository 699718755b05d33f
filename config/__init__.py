from __future__ import annotations

# Importing the Celery app here makes `shared_task` bind to it wherever Django is set up.
from config.celery import app as celery_app

__all__ = ["celery_app"]
