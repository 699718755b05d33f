"""Task environments, the rules both sides apply: an environment's name, its interpreter's path, the list the control
plane sends an agent (AGENT_ENVIRONMENTS), and a job's requirements file.

A task environment is a Python installation on the hosts (a venv, a conda env, a system Python) with TensorFlow in
it, registered per cluster by staff under a name (orchestrator/models/environments.py); a job names one and its
tasks run in it. Each agent probes the interpreters it is told of and reports what it found
(contracts/host_reports.py EnvironmentFacts); placement uses only hosts whose probe of the job's environment is ok.

The empty name and the empty interpreter mean "the agent's own interpreter": what every job ran in before
environments existed, and what a cluster with no environment registered still runs in.

Plain Python, stdlib only: the agent re-checks what the control plane checked (the wire may carry junk).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

# The control plane -> an agent: the cluster's environments (name and interpreter each), sent signed on the agent's
# hello and whenever staff change them; the agent probes each and reports them in HostFacts.environments.
AGENT_ENVIRONMENTS = "agent.environments"

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
NAME_RULE = "1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. tf-2.17-cuda12)"
_NAME = re.compile(NAME_PATTERN)
MAX_INTERPRETER_CHARS = 4096
MAX_ENVIRONMENTS = 32  # per cluster: each is probed by every host of it
MAX_LABELS_CHARS = 200

# Placement tells hosts that have an environment by a label of this form (orchestrator/scheduler/fleet_state.py); a
# label a person writes has no ':' (orchestrator/models/validators.py), so the two never meet.
LABEL_PREFIX = "env:"

# A job's requirements file: pip requirement lines, nothing else (no options, paths, URLs).
MAX_REQUIREMENTS_BYTES = 64 * 1024
MAX_REQUIREMENT_LINES = 500
_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"  # a project name (PEP 508)
    r"(?:\[[A-Za-z0-9._-]+(?:\s*,\s*[A-Za-z0-9._-]+)*\])?"  # extras
    r"(?:\s*(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+"  # version specifiers, comma-separated
    r"(?:\s*,\s*(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+)*)?$"
)


def name_problem(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        return f"an environment's name is {NAME_RULE}"
    return ""


def interpreter_problem(path: Any) -> str:
    """Why `path` cannot be an environment's interpreter ("" when it can): an absolute path, no NUL, bounded."""
    if not isinstance(path, str) or not path:
        return "the interpreter is an absolute path on the hosts, e.g. /opt/envs/tf-2.17/bin/python"
    if len(path) > MAX_INTERPRETER_CHARS or "\x00" in path or "\n" in path:
        return f"the interpreter's path is at most {MAX_INTERPRETER_CHARS} characters of one line"
    if not os.path.isabs(path) or os.path.normpath(path) != path.rstrip("/") or path.endswith("/"):
        return f"the interpreter must be a plain absolute path (no '..', no trailing '/'): {path[:200]!r}"
    return ""


@dataclass(frozen=True)
class Environment:
    """One environment as the agent is told of it."""

    name: str
    interpreter: str


def environments_body(environments: list[Environment]) -> dict[str, Any]:
    return {"environments": [{"name": e.name, "interpreter": e.interpreter} for e in environments]}


def environments_from(body: Any) -> list[Environment]:
    """The environments of an AGENT_ENVIRONMENTS body; ValueError when it is malformed (bounded before it is read)."""
    try:
        raw = body["environments"]
        if not isinstance(raw, list) or len(raw) > MAX_ENVIRONMENTS:
            raise ValueError(f"at most {MAX_ENVIRONMENTS} environments in a list")
        found: list[Environment] = []
        for item in raw:
            name, interpreter = item["name"], item["interpreter"]
            problem = name_problem(name) or interpreter_problem(interpreter)
            if problem:
                raise ValueError(problem)
            found.append(Environment(name, interpreter))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed environment list: {exc!r}") from exc
    if len({e.name for e in found}) != len(found):
        raise ValueError("an environment is named twice")
    return found


def requirements_problems(text: Any) -> list[str]:
    """What is wrong with a job's requirements file (an empty list when nothing): requirement lines only, e.g.
    `scikit-learn==1.5.2` or `rich[jupyter]>=13,<14`, with comments and blank lines. Options (`-e`, `-r`,
    `--index-url`, `-f`, ...), paths, URLs and environment markers are refused: the agent's pip reads nothing but
    the package index it is configured with, and nothing of the host."""
    if not isinstance(text, str):
        return ["the requirements file must be text"]
    if len(text.encode("utf-8", "replace")) > MAX_REQUIREMENTS_BYTES:
        return [f"the requirements file is larger than {MAX_REQUIREMENTS_BYTES // 1024} KiB"]
    lines = text.splitlines()
    if len(lines) > MAX_REQUIREMENT_LINES:
        return [f"the requirements file has more than {MAX_REQUIREMENT_LINES} lines"]
    problems = []
    for number, line in enumerate(lines, 1):
        requirement = requirement_of(line)
        if requirement is None:
            continue
        if requirement.startswith("-"):
            problems.append(f"line {number}: pip options ({requirement.split()[0][:40]}) are not allowed")
        elif not _REQUIREMENT.match(requirement):
            problems.append(
                f"line {number}: {requirement[:80]!r} is not a plain requirement such as name==1.2 "
                "(no paths, URLs or markers)"
            )
        if len(problems) >= 5:
            break
    return problems


def requirement_of(line: str) -> str | None:
    """The requirement a line holds, None for a blank or comment line."""
    text = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
    return text or None


def normalized_requirements(text: str) -> str:
    """The requirement lines alone, one per line, in order: what is installed, and what the cache is keyed by (a
    comment changed builds nothing again)."""
    return "".join(f"{r}\n" for line in text.splitlines() if (r := requirement_of(line)) is not None)
