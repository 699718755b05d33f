"""A hostile user's script: looks for the control plane's secrets and at another job's folder, and reports what it
found, one `SNOOP <name> <json>` line per probe (read by the test from the task's stored log).

    snoop.py AGENT_WORKDIR TOKEN_FILE VICTIM_JOB_FOLDER
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


def write(path: Path) -> str:
    with open(path, "a") as out:
        out.write("poisoned by another job\n")
    return str(path)


def main() -> None:
    workdir, token_file, victim = map(Path, sys.argv[1:4])
    agent = os.getppid()  # the agent started this process
    own = Path(os.environ["TFDASH_JOB_DIR"])
    found = {
        "ids": {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(), "ppid": agent},
        "env": dict(os.environ),
        "agent_environ": attempt(lambda: Path(f"/proc/{agent}/environ").read_bytes().decode(errors="replace")),
        "agent_cmdline": attempt(lambda: Path(f"/proc/{agent}/cmdline").read_bytes().decode(errors="replace")),
        "workdir_list": attempt(lambda: os.listdir(workdir)),
        "ledger_list": attempt(lambda: os.listdir(workdir / "ledger")),
        "running_list": attempt(lambda: os.listdir(workdir / "running")),
        "token_read": attempt(token_file.read_text),
        "workdir_write": attempt(lambda: write(workdir / "planted.txt")),
        "victim_list": attempt(lambda: os.listdir(victim)),
        "victim_read": attempt((victim / "secret.txt").read_text),
        "victim_write": attempt(lambda: write(victim / "planted.txt")),
        "victim_checkpoint_write": attempt(lambda: write(victim / "checkpoints" / "ckpt-1")),
        "own_write": attempt(lambda: write(own / "mine.txt")),
    }
    for name, value in found.items():
        print(f"SNOOP {name} {json.dumps(value)}", flush=True)


if __name__ == "__main__":
    main()
