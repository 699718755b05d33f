"""Which hosts can run which task environment, from what their agents reported (Host.environments): one rule for
placement (orchestrator/scheduler/fleet_state.py: a host has the label `env:<name>` of each environment it can run),
submission (a job naming an environment no host can run is refused, saying why) and the host's page.

A host can run an environment when its agent's probe of it is ok, of the interpreter registered now, and, on a host
with GPUs (where every device a task holds is a GPU), when the environment's TensorFlow can use them (no
`gpu_reason`): a job must not train on the CPU of a GPU host while its GPUs sit booked and idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from contracts.environments import LABEL_PREFIX


def label(name: str) -> str:
    return f"{LABEL_PREFIX}{name}"


def why_not(report: Any, interpreter: str, has_gpus: bool) -> str:
    """Why a host whose report of the environment is `report` (a dict of EnvironmentFacts, None when it reported
    none) cannot run it with `interpreter`; "" when it can."""
    if not isinstance(report, dict):
        return "not probed yet (its agent has not reported it: an older agent, or the probe is running)"
    if report.get("interpreter") != interpreter:
        return "not probed yet with the interpreter registered now"
    if not report.get("ok"):
        return f"its probe failed: {report.get('error') or 'no reason given'}"
    if has_gpus and report.get("gpu_reason"):
        return f"its TensorFlow cannot use the host's GPUs: {report['gpu_reason']}"
    return ""


def reports_of(environments: Any) -> dict[str, dict[str, Any]]:
    """A host's stored environment reports by name (anything malformed is left out)."""
    if not isinstance(environments, list):
        return {}
    return {e["name"]: e for e in environments if isinstance(e, dict) and isinstance(e.get("name"), str)}


def usable(environments: Any, registered: Mapping[str, str], has_gpus: bool) -> frozenset[str]:
    """The names of the registered environments (name -> interpreter) a host with these reports can run."""
    reports = reports_of(environments)
    return frozenset(
        name for name, interpreter in registered.items() if not why_not(reports.get(name), interpreter, has_gpus)
    )


def labels(environments: Any, registered: Mapping[str, str], has_gpus: bool) -> frozenset[str]:
    return frozenset(label(name) for name in usable(environments, registered, has_gpus))


def hosts_problem(name: str, interpreter: str, hosts: Iterable[tuple[str, Any, bool]], cluster: str) -> str:
    """Why no host of the cluster can run environment `name` ("" when one can), from (host name, its reports,
    whether it has GPUs) of every host: what a refused submission says."""
    hosts = list(hosts)
    if not hosts:
        return f"cluster {cluster} has no hosts"
    reasons = []
    for host, environments, has_gpus in hosts:
        why = why_not(reports_of(environments).get(name), interpreter, has_gpus)
        if not why:
            return ""
        reasons.append(f"{host}: {why}")
    shown = "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")
    return f"no host of cluster {cluster} can run environment {name}: {shown}"
