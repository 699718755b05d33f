"""A hostile user's script: tries to read a running job's script, arguments and config, and reports one
`SNOOPJOB <name> <json>` line per probe (read by the test from the task's stored log).

    snoop_a_job.py VICTIM_PID VICTIM_SCRIPT OLD_SCRIPT_CACHE SECRET...
"""

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def attempt(probe: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": True, "value": probe()}
    except OSError as exc:
        return {"ok": False, "errno": exc.errno, "error": str(exc)}


def carrying(secrets: list[str]) -> list[int]:
    """Every other uid's process whose command line or environment shows one of the secrets (as far as this uid can
    read them; its own processes carry them: they were given to it as arguments)."""
    found = []
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):
        try:
            if os.stat(f"/proc/{pid}").st_uid == os.getuid():
                continue
        except OSError:
            continue
        for part in ("cmdline", "environ"):
            try:
                text = Path(f"/proc/{pid}/{part}").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if any(secret in text for secret in secrets):
                found.append(int(pid))
    return found


def main() -> None:
    victim, script, old_cache = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    secrets = sys.argv[4:]
    found = {
        "cmdline": attempt(lambda: Path(f"/proc/{victim}/cmdline").read_bytes().decode(errors="replace")),
        "environ": attempt(lambda: Path(f"/proc/{victim}/environ").read_bytes().decode(errors="replace")),
        "script": attempt(script.read_text),
        "script_folder": attempt(lambda: os.listdir(script.parent)),
        "old_cache": attempt(old_cache.read_text),
        "carrying": attempt(lambda: carrying(secrets)),
    }
    for name, value in found.items():
        print(f"SNOOPJOB {name} {json.dumps(value)}", flush=True)


if __name__ == "__main__":
    main()
