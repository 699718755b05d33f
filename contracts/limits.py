"""Limits both sides enforce, so what one side accepts the other does not drop later."""

from __future__ import annotations

# The shape of a job (placement refuses more; the job form, API and CLI bound their fields with the same numbers).
MAX_WORKERS = 256
MAX_PS = 64
MAX_DEVICES_PER_WORKER = 64

# TCP ports a host may hand to TF tasks: below 1024 is privileged, 65535 is the highest.
PORT_MIN = 1024
PORT_MAX = 65535

# An artifact travels base64 in one stream entry and is stored in one row.
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024

# A task's output line: the agent cuts longer lines here, the orchestrator stores at most this much of one.
MAX_LOG_LINE_CHARS = 10_000

# What one host may report about itself (more is a lie or a bug; the report is refused): nothing the control plane
# builds from a report (device lists, placement state) may grow past these.
MAX_HOST_CPUS = 4096
MAX_HOST_GPUS = 64
MAX_HOST_MEMORY_MB = 2**40  # a petabyte and then some
