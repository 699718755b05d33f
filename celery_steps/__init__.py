"""Celery bootsteps both sides' workers add (the control plane's app in config/celery.py, every agent's in
worker_agent/app.py), and the control plane's send through a Celery app (sending.py: a pooled connection Kombu left
broken fails as a broker error): Celery and Kombu only, imports neither side."""
