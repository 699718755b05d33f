"""Celery bootsteps both sides' workers add (the control plane's app in config/celery.py, every agent's in
worker_agent/app.py): Celery and Kombu only, imports neither side."""
