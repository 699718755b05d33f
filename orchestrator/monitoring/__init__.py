"""What Prometheus scrapes at GET /metrics: read from the database and Redis at scrape time (collector.py)."""
