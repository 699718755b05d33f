"""What training reports, from the Redis Stream to the browser: the stream consumer, the idempotent bulk ingest, the
history reads and the live push to a job's WebSocket group."""
