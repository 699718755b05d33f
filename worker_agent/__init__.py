"""What runs on each training host: the agent (a Celery consumer on `agent.<host>` that supervises the TF task
processes, samples the host and reports) and the TF-side runtime (`worker_agent.runtime`: built-in programs, the
metric callback, checkpoints), plus `report()` for a user's own training loop.

Nothing here imports Django: a training host needs this package, `contracts`, and a Redis URL.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from worker_agent.report import report as report  # public: `from worker_agent import report`


def _version() -> str:
    # The agent's own distribution (agent/pyproject.toml) on a host, the product's (which ships it too) elsewhere.
    for distribution in ("tfdash-agent", "tfdash"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "0.0.0+checkout"  # running from a checkout that was never installed


__version__ = _version()
