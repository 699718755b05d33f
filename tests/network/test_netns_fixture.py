"""The network-namespace fixture itself (tests/support/netns.py): hosts reach each other and the root namespace's
gateway address over TCP, a cut cable reaches nothing until mended, and closing leaves no namespace, link or process
behind. Where it cannot run, the skip says why."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support import netns
from tests.support.netns import Network, unavailable_reason, wait_connects
from tests.support.processes import wait_until

pytestmark = pytest.mark.netns


@pytest.fixture
def two_hosts() -> Iterator[Network]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with Network(2) as net:
        yield net


def _listener(address: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.listen()
    return sock


def test_hosts_reach_each_other_and_the_gateway_until_a_cable_is_cut(two_hosts: Network) -> None:
    net = two_hosts
    first, second = net.hosts
    assert first.address != second.address and net.gateway not in (first.address, second.address)
    with _listener(net.gateway) as control:
        assert net.connects(first, net.gateway, control.getsockname()[1])
    server = net.start(
        second, "listener", [sys.executable, "-I", "-c", _SERVE, "23000"], {"PATH": "/usr/bin:/bin"}
    )  # a port of its own namespace: each host has all its ports
    server.wait_for_line("listening", timeout=30)
    assert net.connects(first, second.address, 23000)
    assert server.pid in net.pids(second)

    net.cut(second)
    assert not net.connects(first, second.address, 23000, timeout_s=2)

    net.mend(second)
    wait_connects(net, first, second.address, 23000)


def test_closing_removes_namespaces_links_and_the_processes_left_inside() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    net = Network(1)
    host = net.hosts[0]
    orphan = subprocess.Popen(host.command([sys.executable, "-I", "-c", "import time; time.sleep(600)"]))
    # `ip netns exec` enters the namespace, then execs (same pid): closed before that, it was not inside to be killed
    # (on a loaded machine it then slept its 600 s in a namespace already gone).
    wait_until(lambda: str(orphan.pid) in _pids_inside(host.netns), timeout=30, what="the process inside the namespace")

    net.close()

    assert orphan.wait(timeout=30) == -9
    assert host.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert net.bridge not in links and host.veth not in links


def test_the_skip_reason_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert unavailable_reason() == "network namespaces need root (this test run is not root)"
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda name: None)
    assert "`ip` command" in unavailable_reason()


_SERVE = """
import socket, sys, time
s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""


def _pids_inside(namespace: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
