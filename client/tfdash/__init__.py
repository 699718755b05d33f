"""tfdash from a terminal or a Python program: `tfdash` (tfdash.cli) and `from tfdash.client import Client`."""

from __future__ import annotations

__version__ = "0.1.0"
