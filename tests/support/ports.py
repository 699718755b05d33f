"""Ports for the tests' own servers and TF tasks: from a window below the kernel's range for outgoing connections, a
share of it per pytest-xdist worker, handed out in turn by each test process.

A port from bind(("127.0.0.1", 0)) is an ephemeral port, from the range every outgoing connection's local port is
taken from too: between a test choosing it and its server binding it (a TF task imports TensorFlow first: seconds),
one of the suite's many connections to Redis or PostgreSQL could take it (CI: a MultiWorkerMirrored worker's "Could
not start gRPC server: Address already in use"). A port below that range is taken only by a server that asks for it.
The window lies above the hosts' fixed TF port ranges the tests register (20000-31999), and the workers' shares do not
overlap (bench/chaos.py takes its hosts' ranges from 10000-20000 the same way).
"""

from __future__ import annotations

import itertools
import random
import socket
import threading

from tests.support.workers import WORKER, WORKER_COUNT

WINDOW = range(32000, 32768)  # Linux's ip_local_port_range starts at 32768 by default


_SIZE = len(WINDOW) // WORKER_COUNT
_FIRST = WORKER % WORKER_COUNT * _SIZE
SHARE = WINDOW[_FIRST : _FIRST + _SIZE]
# Each process starts somewhere in its share and goes round it: a suite run right after another does not meet the
# last run's ports first (a closed server's port lingers in TIME_WAIT, and a port still in use is skipped anyway).
_turn = itertools.count(random.randrange(len(SHARE)))
_lock = threading.Lock()


def free_ports(count: int, address: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports of this worker's share that nothing holds on `address` now (checked by binding them)."""
    chosen: list[int] = []
    with _lock:
        for _ in range(len(SHARE)):
            port = SHARE[next(_turn) % len(SHARE)]
            if _bindable(address, port):
                chosen.append(port)
                if len(chosen) == count:
                    return chosen
    raise RuntimeError(
        f"fewer than {count} free ports in {SHARE.start}-{SHARE.stop - 1}: servers of earlier tests left?"
    )


def free_port(address: str = "127.0.0.1") -> int:
    return free_ports(1, address)[0]


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True
