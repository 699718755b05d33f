"""A native abort (as a failed CHECK in a C++ library does): SIGABRT, no Python traceback. The fallback verdict names
the signal."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    print("F0000 check failed: dims == 2 (3 vs. 2)", file=sys.stderr, flush=True)
    os.abort()
