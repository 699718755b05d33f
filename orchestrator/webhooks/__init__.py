"""Webhooks: registering a receiver (hooks.py), the outbox of job state changes turned into deliveries and delivered
at least once with backoff (outbox.py, delivering.py), over a checked, signed, bounded POST (addresses.py, sending.py).

May import: contracts, models, plumbing, identity."""
