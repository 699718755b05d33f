"""What training reports, from the Redis Stream to the browser: the stream consumer and the idempotent bulk ingest
(stream.py, ingest.py, batch.py, points.py, log_store.py, artifacts.py, drops.py, lookups.py), the reads (history.py,
log_reader.py, rollups.py, hosts.py, runs.py, tensorboard.py), the one push to a job's pages (live.py), host
samples' retention (retention.py) and each job's progress and ETA kept at ingest (progress.py).

May import: contracts, core, limits, models, plumbing, identity, objectstore."""
