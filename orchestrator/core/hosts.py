"""A host as placement sees it (`HostState`: its ports, devices, labels, liveness and what is in use), the machine an
address stands for (hosts on one machine share its ports) and a fleet's capacity summary. Plain Python (no Django): the
caller turns host rows into these (orchestrator/scheduler/fleet_state.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class HostState:
    name: str
    address: str
    port_min: int
    port_max: int
    device_ids: tuple[int, ...]
    gpu: bool
    labels: frozenset[str]
    online: bool
    used_devices: frozenset[int]
    used_ports: frozenset[int]
    excluded_ports: frozenset[int] = frozenset()

    @cached_property
    def free_devices(self) -> tuple[int, ...]:
        # Asked for by every job a pass looks at, of every host: computed once per state (a state is never changed,
        # `take` makes a new one for a host a job landed on).
        return tuple(sorted(set(self.device_ids) - self.used_devices))

    def with_used(self, ports: Iterable[int], devices: Iterable[int]) -> HostState:
        """This host with more ports and devices in use (a job just placed on it, or devices reserved for another)."""
        return self._with(self.used_ports | frozenset(ports), self.used_devices | frozenset(devices))

    def with_free(self, devices: Iterable[int]) -> HostState:
        """This host with these devices free again (a running gang that will have ended by some time)."""
        return self._with(self.used_ports, self.used_devices - frozenset(devices))

    def _with(self, used_ports: frozenset[int], used_devices: frozenset[int]) -> HostState:
        # Made by the constructor, not dataclasses.replace (which looks the fields up on every call: a pass makes tens
        # of thousands of these). What does not depend on use (the idle copy, the machine, the fixed facts) is carried
        # over, so the next job of the pass does not compute it again.
        made = HostState(
            name=self.name, address=self.address, port_min=self.port_min, port_max=self.port_max,
            device_ids=self.device_ids, gpu=self.gpu, labels=self.labels, online=self.online,
            used_devices=used_devices, used_ports=used_ports, excluded_ports=self.excluded_ports,
        )  # fmt: skip
        for name in _CARRIED:
            if name in self.__dict__:
                made.__dict__[name] = self.__dict__[name]
        return made

    @cached_property
    def fixed(self) -> tuple[object, ...]:
        """What does not depend on use or liveness: all that the idle check reads."""
        return (self.name, self.address, self.port_min, self.port_max, self.device_ids, self.gpu, self.labels)

    @cached_property
    def machine(self) -> str:
        return machine_of(self.address)

    @cached_property
    def idle(self) -> HostState:
        """This host online with nothing running: what "does the job fit the cluster at all" is judged on."""
        return dataclasses.replace(
            self, online=True, used_devices=frozenset(), used_ports=frozenset(), excluded_ports=frozenset()
        )


_CARRIED = ("idle", "machine", "fixed")  # HostState's cached facts that do not depend on use


def capacity_summary(hosts: Iterable[HostState]) -> dict[str, int]:
    hosts = list(hosts)
    online = [h for h in hosts if h.online]
    free = [len(h.free_devices) for h in online]
    return {
        "hosts": len(hosts),
        "online": len(online),
        "devices": sum(len(h.device_ids) for h in hosts),
        "free_devices": sum(free),
        "largest_free": max(free, default=0),
    }


def machine_of(address: str) -> str:
    """The machine a host's address stands for: every loopback address is this one machine."""
    # TF's gRPC server binds 0.0.0.0, so every loopback address is the same machine for port purposes.
    if address.startswith("127.") or address in ("localhost", "::1"):
        return "loopback"
    return address
