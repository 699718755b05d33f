"""No traceback: the script gives up with an exit status of its own. The fallback verdict still names the task, how it
ended and its last words."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    print("validation accuracy 0.07 is below 0.5: giving up", file=sys.stderr, flush=True)
    sys.exit(3)
