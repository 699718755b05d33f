"""A script that stops making progress: one line, then it waits forever (for a peer, a lock, input that never comes).
The product's hang detection ends it; the verdict says which task stopped reporting first."""

import time

print("started", flush=True)
while True:
    time.sleep(3600)
