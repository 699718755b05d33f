"""A user's script that leaves a process behind, or looks for one an earlier job left under its uid.

escapes.py leave    double-forks a `setsid` sleeper (out of the task's process group and session, its pipes let
                    go) and exits at once; prints `SLEEPER <pid>`
escapes.py look     prints `SEEN <json>`: every process of its own uid that is not itself or its own child
"""

import json
import os
import sys
import time


def leave() -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            print(f"SLEEPER {os.getpid()}", flush=True)
            quiet = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(quiet, fd)
            os.closerange(3, 1024)  # the metrics pipe too: nothing ties it to the task any more
            time.sleep(3600)
        os._exit(0)
    os.wait()


def look() -> None:
    me, uid, seen = os.getpid(), os.getuid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        uids = [int(u) for u in fields["Uid"].split()]
        if uid in uids and int(fields["PPid"]) != me and not fields["State"].strip().startswith(("Z", "X")):
            seen.append({"pid": int(name), "command": command.strip(), "state": fields["State"].strip()})
    print(f"SEEN {json.dumps({'uid': uid, 'processes': seen})}", flush=True)


if __name__ == "__main__":
    {"leave": leave, "look": look}[sys.argv[1]]()
