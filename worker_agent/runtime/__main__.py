"""`python -m worker_agent.runtime --program NAME [--config-json JSON]`: see worker_agent/runtime/train.py."""

from __future__ import annotations

import sys

from worker_agent.runtime.train import main

if __name__ == "__main__":
    sys.exit(main())
