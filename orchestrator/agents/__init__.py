"""The orchestrator's side of the agents: their tokens and how messages are authenticated, hello and heartbeat
reports, task events and log lines, host liveness (the watchdog) and reconciling what an agent says runs."""
