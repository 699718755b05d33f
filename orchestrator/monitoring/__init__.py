"""What Prometheus scrapes at GET /metrics: read from the database and Redis at scrape time (collector.py), for
staff or the TFDASH_METRICS_TOKEN bearer (views.py).

May import: contracts, models, plumbing, identity, leases, metrics, usage, scheduler, agents."""
