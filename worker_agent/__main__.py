from __future__ import annotations

import sys

from worker_agent.cli import main

sys.exit(main())
