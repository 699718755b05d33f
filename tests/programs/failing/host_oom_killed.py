"""What the kernel's OOM killer leaves: a process killed by SIGKILL, no traceback, nobody in the product asked for it.

The kill is sent by the script itself (a real OOM kill would take the machine's memory, shared here); the agent sees
exactly what it sees after the kernel's kill: exit -9 and no kill reason of its own."""

from __future__ import annotations

import os
import signal

if __name__ == "__main__":
    batches = [bytearray(16 << 20) for _ in range(4)]  # the process grows ...
    print(f"holding {sum(map(len, batches)) >> 20} MiB of batches", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # ... and the kernel kills it as it would at the cgroup's memory limit
