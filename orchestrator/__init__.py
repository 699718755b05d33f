"""The control plane: one Django app, a package per feature (docs/architecture.md has the map and the layers). Its root
holds only the wiring: admin.py (the Django admin), apps.py (signal hookup), checks.py (start-up checks), tasks.py
(the one module of Celery entry points), and limits.py, the per-user bounds the features read."""
