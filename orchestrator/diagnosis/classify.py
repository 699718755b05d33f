"""The verdict from the failed attempt's tasks and the job's end, by the table in rules.py (plain Python, no Django).

The cause is the earliest-finished task whose failure is not a consequence kind (a peer's gRPC `UnavailableError`, a
collective abort, a task the product stopped); the others that failed are its peers. A task the product stopped is
judged by the consequence rules only: whatever it printed while it was being stopped, it did not end the job. A
job-level rule (time limit, no progress, never connected) names the job's end itself, with the task it concerns.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from orchestrator.diagnosis.rules import JOB_RULES, PS, TASK_RULES, Rule

MAX_EVIDENCE = 12
_EPOCH = datetime.min.replace(tzinfo=UTC)
_LINE_CHARS = 300
_MSG_CHARS = 240

# The last line of a traceback: a (dotted) exception class name, then its message.
_EXCEPTION_LINE = re.compile(
    r"^(?P<exc>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Warning)|StopIteration))"
    r"(?::\s?(?P<msg>.*))?$"
)
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)')
# Frames that are not the user's: libraries, the interpreter, the product's own runtime around the script.
_NOT_USER = ("site-packages/", "dist-packages/", "/lib/python3", "/worker_agent/", "<")
# TensorFlow prefixes an op's error with the function it ran in: noise in a sentence.
_TF_FUNCTION_PREFIX = re.compile(r"^\{\{function_node [^}]*\}\}\s*")


@dataclass(frozen=True)
class TaskEnd:
    """What is known of one task of the failed attempt."""

    label: str  # "worker 1 on host-b"
    id: int | None
    type: str
    index: int
    state: str  # failed | lost | killed | succeeded | running ...
    exit_code: int | None
    detail: str  # what the agent (kill reason) or the orchestrator (lost, port) said of its end
    finished_at: datetime | None
    lines: tuple[str, ...]  # its last log lines (stderr first: where a traceback goes), oldest first
    host: str = ""
    last_seen: datetime | None = None  # when its newest log line arrived (which task stopped reporting first)


@dataclass(frozen=True)
class JobEnd:
    state: str  # failed | timed_out
    reason: str
    strategy: str
    failed_task_id: int | None = None
    # The script's file as the tasks ran it (the agent names it by its content's hash) and the name it was uploaded
    # under: frames say the latter.
    script_file: str = ""
    script_name: str = ""


@dataclass(frozen=True)
class _Judged:
    task: TaskEnd
    rule: Rule
    groups: dict[str, str]
    matched_line: str


def classify(job: JobEnd, tasks: Sequence[TaskEnd], now: datetime | None = None) -> dict[str, Any]:
    """The diagnosis dict of docs' shape (kind, title, message, hint, task, task_id, evidence, peers, at)."""
    at = (now or datetime.now(UTC)).isoformat()
    ended = [judge(job, task) for task in tasks if task.state in ("failed", "lost", "killed")]
    job_rule, job_groups = _job_rule(job)
    if job_rule is not None:
        cause_task = _job_rule_task(job_rule, job, tasks)
        judged = next((j for j in ended if cause_task is not None and j.task is cause_task), None)
        groups = {**(judged.groups if judged else {}), **job_groups}
        verdict = _verdict(job_rule, cause_task, groups, job, matched="")
        peers = [j for j in ended if j.task is not cause_task]
    else:
        cause = _cause(job, ended)
        if cause is None:
            return {**_verdict(TASK_RULES[-1], None, {}, job, matched=""), "peers": [], "at": at}
        verdict = _verdict(cause.rule, cause.task, cause.groups, job, matched=cause.matched_line)
        peers = [j for j in ended if j is not cause]
    verdict["peers"] = [
        {"task": p.task.label, "task_id": p.task.id, "kind": p.rule.kind, "message": _peer_message(p)}
        for p in sorted(peers, key=_finish_order)
    ]
    verdict["at"] = at
    return verdict


def judge(job: JobEnd, task: TaskEnd) -> _Judged:
    """The first task rule whose every criterion holds for `task` (the table's last row, unknown, always does)."""
    stopped = task.state == "killed"
    text = "\n".join(task.lines)
    for rule in TASK_RULES:
        if stopped and not rule.consequence:
            continue
        groups = _matches(rule, job, task, text)
        if groups is not None:
            return _Judged(task, rule, {k: v for k, v in groups.items() if k != "_line" and v}, groups["_line"])
    raise AssertionError("the rules end with a rule that always matches")  # pragma: no cover


def _matches(rule: Rule, job: JobEnd, task: TaskEnd, text: str) -> dict[str, str] | None:
    if rule.task_states and task.state not in rule.task_states:
        return None
    if rule.exit_codes and task.exit_code not in rule.exit_codes:
        return None
    if rule.strategies and job.strategy not in rule.strategies:
        return None
    groups: dict[str, str] = {"_line": ""}
    if "detail" in rule.compiled:
        found = rule.compiled["detail"].search(task.detail)
        if found is None:
            return None
        groups.update(found.groupdict(default=""))
    if "lines" in rule.compiled:
        found = rule.compiled["lines"].search(text)
        if found is None:
            return None
        groups.update(found.groupdict(default=""))
        start = text.rfind("\n", 0, found.start()) + 1
        end = text.find("\n", found.end())
        groups["_line"] = text[start : end if end >= 0 else len(text)]
    return groups


def _job_rule(job: JobEnd) -> tuple[Rule | None, dict[str, str]]:
    for rule in JOB_RULES:
        if rule.job_states and job.state not in rule.job_states:
            continue
        if "reason" in rule.compiled:
            found = rule.compiled["reason"].search(job.reason)
            if found is None:
                continue
            return rule, found.groupdict(default="")
        return rule, {}
    return None, {}


def _job_rule_task(rule: Rule, job: JobEnd, tasks: Sequence[TaskEnd]) -> TaskEnd | None:
    """The task a job-level verdict names: for a hang, the one whose log went quiet first; for a gang that never
    connected, the one the job's reason names first; none for a time limit."""
    if rule.kind == "hang" and tasks:
        # A ParameterServer job's workers and ps only serve (they print nothing once started): its chief reports.
        speakers = [t for t in tasks if t.type == "chief"] if job.strategy == PS else []
        return min(speakers or tasks, key=lambda t: (t.last_seen is not None, t.last_seen or _EPOCH, t.type, t.index))
    if rule.kind == "never_connected":
        return next((t for t in tasks if t.id == job.failed_task_id), tasks[0] if tasks else None)
    return None


def _finish_order(judged: _Judged) -> tuple[Any, ...]:
    finished = judged.task.finished_at
    return (finished is None, finished or _EPOCH, judged.task.type, judged.task.index)


def _cause(job: JobEnd, ended: list[_Judged]) -> _Judged | None:
    """The earliest-finished failure that is not a consequence; else the earliest failure; else (only tasks the
    product stopped) the task the job's reason names."""
    own = [j for j in ended if not j.rule.consequence]
    failed = [j for j in ended if j.task.state != "killed"]
    for group in (own, failed):
        if group:
            return min(group, key=_finish_order)
    named = [j for j in ended if j.task.id == job.failed_task_id]
    return named[0] if named else (min(ended, key=_finish_order) if ended else None)


def _verdict(rule: Rule, task: TaskEnd | None, groups: dict[str, str], job: JobEnd, *, matched: str) -> dict[str, Any]:
    facts = _facts(task, job)
    facts.update(groups)
    return {
        "kind": rule.kind,
        "title": _one_line(rule.title.format_map(facts)),
        "message": _one_line(rule.message.format_map(facts)),
        "hint": _one_line(rule.hint.format_map(facts)),
        "task": task.label if task else "",
        "task_id": task.id if task else None,
        "evidence": _evidence(task, job, matched),
    }


def _facts(task: TaskEnd | None, job: JobEnd) -> dict[str, str]:
    """What the templates may name (rules.py's docstring)."""
    facts = {"task": "the job", "host": "its host", "exc": "", "msg": "", "where": "", "at_where": "", "how": "",
             "last": "", "detail": "", "code": "", "reason": job.reason, "path": "", "module": "", "port": "",
             "seconds": "", "device": "", "shape": ""}  # fmt: skip
    if task is None:
        return facts
    facts.update(task=task.label, host=task.host or "its host", detail=task.detail, how=_how(task))
    facts["code"] = "" if task.exit_code is None else str(task.exit_code)
    exception = _last_exception(task.lines)
    if exception is not None:
        name, message = exception
        facts["exc"], facts["msg"] = name, message
    if where := user_frame(task.lines, {job.script_file: job.script_name} if job.script_file else {}):
        facts["where"], facts["at_where"] = where, f" at {where}"
    facts["last"] = _last_words(task, exception)
    return facts


def _how(task: TaskEnd) -> str:
    code = task.exit_code
    if code is None:
        return task.state if task.state != "failed" else "no exit code"
    if code < 0 or code > 128:
        number = -code if code < 0 else code - 128
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "?"
        return f"killed by signal {number} ({name})" if code < 0 else f"exit code {code}, signal {number} ({name})"
    return f"exit code {code}"


def _last_exception(lines: Sequence[str]) -> tuple[str, str] | None:
    """The short name and message of the last exception line in `lines`."""
    for line in reversed(lines):
        found = _EXCEPTION_LINE.match(line.rstrip())
        if found:
            message = _TF_FUNCTION_PREFIX.sub("", found.group("msg") or "").strip()
            return found.group("exc").rsplit(".", 1)[-1], _shorten(message, _MSG_CHARS)
    return None


def user_frame(lines: Sequence[str], names: Mapping[str, str] | None = None) -> str:
    """The innermost frame of the user's own code in the last traceback, as file:line ("" when none); a file named in
    `names` is shown by the name it maps to."""
    for line in reversed(lines):
        found = _FRAME.match(line)
        if found and _is_user_path(found.group("path")):
            name = PurePosixPath(found.group("path")).name
            return f"{(names or {}).get(name, name)}:{found.group('line')}"
    return ""


def _is_user_path(path: str) -> bool:
    return not any(marker in path for marker in _NOT_USER)


def _last_words(task: TaskEnd, exception: tuple[str, str] | None) -> str:
    if exception is not None:
        name, message = exception
        return f"{name}: {message}" if message else name
    said = [line.strip() for line in task.lines if line.strip()]
    if said:
        return _shorten(said[-1], _MSG_CHARS)
    return task.detail or "(no output)"


def _peer_message(peer: _Judged) -> str:
    if peer.rule.kind == "stopped":
        return _one_line(f"stopped by the product after the job's end ({peer.task.detail or _how(peer.task)})")
    exception = _last_exception(peer.task.lines)
    return _one_line(_last_words(peer.task, exception) + f" ({_how(peer.task)})")


def _evidence(task: TaskEnd | None, job: JobEnd, matched: str) -> list[str]:
    """At most MAX_EVIDENCE lines: the traceback's head, the user's frame and its source line, the line the rule
    matched, the exception line and what follows it; the last lines when there is no traceback."""
    if task is None:
        return [job.reason] if job.reason else []
    lines = [line.rstrip() for line in task.lines]
    picked: list[int] = []
    heads = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    start = heads[-1] if heads else 0  # a long TensorFlow traceback may start above the tail
    picked += heads[-1:]
    frames = [(i, found) for i, line in enumerate(lines) if i >= start and (found := _FRAME.match(line))]
    for i, _ in [(i, found) for i, found in frames if _is_user_path(found.group("path"))][-1:]:
        picked += [i, i + 1]
    exceptions = [i for i, line in enumerate(lines) if i > start and _EXCEPTION_LINE.match(line)] if heads else []
    for i in exceptions[-1:]:
        picked += [i, i + 1, i + 2]
    if matched:
        for i in [i for i, line in enumerate(lines) if line == matched.rstrip()][-1:]:
            picked += [i, i + 1]
    if not picked:
        picked = list(range(max(0, len(lines) - 6), len(lines)))
    chosen = sorted({i for i in picked if 0 <= i < len(lines) and lines[i].strip()})
    evidence = [_shorten(lines[i], _LINE_CHARS) for i in chosen][:MAX_EVIDENCE]
    if task.detail and len(evidence) < MAX_EVIDENCE:
        evidence.append(_shorten(f"[agent] {task.detail}", _LINE_CHARS))
    return evidence


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.split())
