"""The control plane's plumbing, no product rules: the hosts' stream reader, its Lua and its doorbell
(streams.py, stream_scripts.py, doorbell.py), counters in Redis, what an outage looks like, compiled reads and writes,
the Celery app object (celery_app.py, wired by config/celery.py) and the one broker send (broker_sends.py), asking for
a scheduler pass by task name (pass_requests.py), work once a transaction commits (after_commit.py), a worker's
start-up chores retried through an outage (start_up.py), and the collector and thread-time helpers for latency.

May import: contracts, kombu_redis, celery_steps, models. Imported by every feature package; imports none of them."""
