"""The agent's one way to write a state file: a temp file in the same folder, then a rename, so an agent killed
mid-write leaves the old content or the new, never half. Not fsynced: state survives the agent being killed, not the
machine losing power (after which every task of the host is gone anyway)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes(path: Path, content: bytes, mode: int = 0o600) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any, mode: int = 0o600) -> None:
    write_bytes(path, json.dumps(value).encode(), mode)
