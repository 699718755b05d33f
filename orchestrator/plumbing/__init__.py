"""The control plane's plumbing, no product rules: the hosts' stream reader and its Lua, counters in Redis,
what an outage looks like, compiled reads and writes, the one broker send, asking for a scheduler pass by task name,
and the collector and thread-time helpers for latency.

May import: contracts, kombu_redis, orchestrator.models. Imported by every feature package; imports none of them."""
