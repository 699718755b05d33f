"""Several "machines" with their own network addresses on this one: Linux network namespaces on a bridge.

`Network(n)` makes a bridge of a name of its own (`tfd<6 hex>`, so parallel runs never share one), a random private
10.a.b.0/24 that no interface or route of this machine uses yet, the root namespace on the bridge's .1 (the gateway:
what the control plane, bound there, is reached at), and n namespaces, each with a veth pair whose root end is on the
bridge, its own address .2, .3 ... and its loopback up. A process is started in a namespace by argv (`ip netns exec
NAME argv...`, no shell). `cut(host)` takes the root end of its veth down (the machine's cable pulled: its processes
keep running, nothing reaches them and they reach nothing), `mend(host)` puts it back.

Root only. `unavailable_reason()` says why not elsewhere (not root, no `ip`, no network namespaces), for a skip.
Everything is torn down by `close()` (also at interpreter exit, if a test run dies first): every process left in each
namespace SIGKILLed, the namespaces (their veth ends with them), the root ends and the bridge.

Reachability is tested with a TCP connect from inside a namespace (`connects`): there is no `ping` on these machines.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import ROOT, ManagedProcess, wait_until

IP = "ip"
MAX_HOSTS = 200  # addresses .2 ... within one /24


class NetworkError(RuntimeError):
    """An `ip` command failed: its argv and what it said."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


def unavailable_reason() -> str:
    """ "" when this process can make namespaces and bridges; else why not, in words fit for a skip."""
    if os.geteuid() != 0:
        return "network namespaces need root (this test run is not root)"
    if shutil.which(IP) is None:
        return "network namespaces need the `ip` command (iproute2), which is not installed here"
    probe = f"tfdprobe{secrets.token_hex(3)}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns add` could not run here: {exc}"
    if made.returncode != 0:
        return f"no network namespace support here: `ip netns add` said {made.stderr.strip()!r}"
    _ip("netns", "delete", probe, check=False)
    bridge = f"tfdprobe{secrets.token_hex(3)}"
    made = _ip("link", "add", bridge, "type", "bridge", check=False)
    if made.returncode != 0:
        return f"no bridge support here: `ip link add ... type bridge` said {made.stderr.strip()!r}"
    _ip("link", "delete", bridge, check=False)
    return ""


def _used_prefixes() -> set[str]:
    """The 10.a.b prefixes this machine already has an address or route in (any namespace's would not clash, but the
    root's routes must stay unambiguous)."""
    text = _ip("-4", "-o", "addr", "show").stdout + _ip("-4", "route", "show", "table", "all", check=False).stdout
    used = set()
    for word in text.split():
        head = word.split("/")[0]
        if head.startswith("10."):
            try:
                network = ipaddress.ip_network(word if "/" in word else f"{word}/32", strict=False)
            except ValueError:
                continue
            if network.prefixlen < 24:  # a wide route: every /24 below it is taken
                return {"10"}
            used.add(".".join(head.split(".")[:3]))
    return used


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_prefixes()
    if "10" in used:
        raise NetworkError("this machine routes a wider part of 10.0.0.0/8; no private /24 is free for the test")
    for _ in range(200):
        prefix = f"10.{random.randint(100, 254)}.{random.randint(0, 254)}"
        if prefix not in used:
            return ipaddress.ip_network(f"{prefix}.0/24")
    raise NetworkError("no free 10.x.y.0/24 found for the test network")


@dataclass(frozen=True)
class NetnsHost:
    """One machine: its namespace, its address on the bridge, and the root end of its cable (its veth)."""

    index: int
    netns: str
    address: str
    veth: str  # the root namespace's end, on the bridge: what `cut` takes down

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv run inside this machine's namespace (`ip netns exec` sets the namespace and execs argv: no shell)."""
        return [IP, "netns", "exec", self.netns, *argv]


class Network:
    """A bridge, its /24, the root namespace on .1, and `count` namespace hosts on .2 ... (see the module's doc)."""

    def __init__(self, count: int) -> None:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"between 1 and {MAX_HOSTS} hosts, not {count}")
        self.bridge = f"tfd{secrets.token_hex(3)}"  # 9 characters: its veths' names stay within IFNAMSIZ (15)
        self.subnet = _free_subnet()
        self.gateway = str(self.subnet.network_address + 1)
        self.hosts: list[NetnsHost] = []
        self.processes: list[ManagedProcess] = []
        self._closed = False
        atexit.register(self.close)
        try:
            self._build(count)
        except BaseException:
            self.close()
            raise

    def _build(self, count: int) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(count):
            host = NetnsHost(i, f"{self.bridge}-h{i}", str(self.subnet.network_address + 2 + i), f"{self.bridge}v{i}")
            self.hosts.append(host)
            peer = f"{self.bridge}p{i}"
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", host.netns)
            _ip("link", "set", host.veth, "master", self.bridge)
            _ip("link", "set", host.veth, "up")
            inside = ("netns", "exec", host.netns, IP)
            _ip(*inside, "link", "set", peer, "name", "eth0")
            _ip(*inside, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
            _ip(*inside, "link", "set", "lo", "up")
            # No default route: a host reaches the bridge's /24 (the control plane and its peers) and nothing else.

    # ----- processes inside -------------------------------------------------------------------------------------------

    def start(
        self, host: NetnsHost, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path = ROOT
    ) -> ManagedProcess:
        """A process in `host`'s namespace (output captured, own process group), killed at `close` at the latest."""
        proc = ManagedProcess(name, host.command(argv), dict(env), cwd)
        self.processes.append(proc)
        return proc

    def connects(self, host: NetnsHost, address: str, port: int, timeout_s: float = 3.0) -> bool:
        """Whether a TCP connection from inside `host` to address:port is accepted."""
        code = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3]))"
        argv = host.command([sys.executable, "-I", "-S", "-c", code, address, str(port), str(timeout_s)])
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout_s + 30, check=False)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def pids(self, host: NetnsHost) -> list[int]:
        """Every process in `host`'s namespace (the agent, the TF tasks it started, anything they left)."""
        listed = _ip("netns", "pids", host.netns, check=False).stdout.split()
        return [int(p) for p in listed if p.isdigit()]

    # ----- faults -----------------------------------------------------------------------------------------------------

    def cut(self, host: NetnsHost) -> None:
        """Pull `host`'s cable: the root end of its veth down. Its processes run on, cut off from everything."""
        _ip("link", "set", host.veth, "down")

    def mend(self, host: NetnsHost) -> None:
        _ip("link", "set", host.veth, "up")

    # ----- teardown ---------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process in every namespace, then remove the namespaces, veths and bridge. Idempotent; each step
        is tried even when one before it failed."""
        if self._closed:
            return
        self._closed = True
        for proc in self.processes:
            with contextlib.suppress(Exception):
                proc.stop()
        for host in self.hosts:
            self.kill_all_in(host)
        for host in self.hosts:
            _ip("netns", "delete", host.netns, check=False)
            _ip("link", "delete", host.veth, check=False)  # gone with its peer's namespace already, normally
        _ip("link", "delete", self.bridge, check=False)
        atexit.unregister(self.close)

    def kill_all_in(self, host: NetnsHost) -> None:
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not self.pids(host), timeout=20, interval=0.2, what=f"{host.netns} to be empty")

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_connects(network: Network, host: NetnsHost, address: str, port: int, timeout: float = 30) -> None:
    """Wait until `host` reaches address:port over TCP (a server just started, a cable just mended)."""
    wait_until(
        lambda: network.connects(host, address, port),
        timeout,
        interval=0.5,
        what=f"{host.netns} ({host.address}) to reach {address}:{port}",
    )
