"""What the `tfdash` commands print: JSON for scripts, or tables and lines for a person (rich markup, every value
from the server escaped), on stdout; progress, refusals and errors on stderr."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tfdash import fields
from tfdash.api_types import TERMINAL_STATES, Job, task_label
from tfdash.errors import Refused, error_text
from tfdash.exit_codes import OK
from tfdash.job_progress import progress_text
from tfdash.terminal import printable

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


# --- output -----------------------------------------------------------------------------------------------------
def _json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True), flush=True)


def _show(ns: argparse.Namespace, value: Any, table: Callable[[Any], Any]) -> int:
    if ns.json:
        _json(value)
    else:
        rendered = table(value)
        if rendered is not None:
            out.print(rendered)
    return OK


def _jobs_table(jobs: list[Job]) -> Table:
    table = Table("id", "name", "state", "progress", "strategy", "shape", "owner", "created", box=None)
    for job in jobs:
        shape = f"{job.get('workers')}w" + (f"+{job.get('ps')}ps" if job.get("ps") else "")
        shape += f" × {job.get('devices_per_worker')}"
        table.add_row(
            str(job.get("id")),
            escape(str(job.get("name"))),
            _state(str(job.get("state"))),
            escape(progress_text(job, short=True)) or "-",
            str(job.get("strategy")),
            shape,
            escape(str(job.get("owner"))),
            str(job.get("created_at", ""))[:19].replace("T", " "),
        )
    return table


def _print_job(job: Job, *, verdict: bool = True) -> None:
    out.print(f"job {job.get('id')} [bold]{escape(str(job.get('name')))}[/]: {_state(str(job.get('state')))}")
    shape = f"{job.get('workers')} worker(s)" + (f" + {job.get('ps')} ps" if job.get("ps") else "")
    out.print(
        f"  {job.get('strategy')}, {shape} × {job.get('devices_per_worker')} device(s), cluster "
        f"{escape(str(job.get('cluster_name')))}, attempt {job.get('attempt')}, restarts {job.get('restarts')}"
    )
    if job.get("reason"):
        out.print(f"  reason: {escape(str(job['reason']))}")
    if progress := progress_text(job):
        out.print(f"  progress: {escape(progress)}")
    if preflight := _preflight(job):
        out.print(f"  preflight: {escape(preflight)}")
    if verdict:
        _print_verdict(job)
    if job.get("env"):
        out.print("  env: " + escape(" ".join(f"{k}={v}" for k, v in (job.get("env") or {}).items())))
    failure = job.get("failure")
    if failure:
        out.print(
            f"  failed task {escape(str(failure.get('task')))} (exit {failure.get('exit_code')}): "
            f"{escape(printable(str(failure.get('detail'))))}"
        )
        for line in failure.get("log_tail") or []:
            out.print(f"    {escape(printable(str(line)))}")


def _preflight(job: Job) -> str:
    """The job's preflight in a line (the API's `preflight`: docs/user-guide/preflight.md), what a preflight checks,
    or "" for neither."""
    if job.get("preflight_for"):
        return f"checks job {job['preflight_for']} (refused if this run fails)"
    run = job.get("preflight")
    if not isinstance(run, dict) or not isinstance(run.get("job"), int):
        return ""
    if run.get("state") == "running":
        return f"#{run['job']} running (at most {run.get('steps')} steps or {run.get('limit_s')} s on one worker)"
    return printable(str(run.get("reason") or f"#{run['job']} {run.get('state')}"))


def _print_outcome(job: Job) -> None:
    _print_job(job, verdict=False)
    line = verdict_line(job)
    if line:  # last, where a CI log's reader looks first
        out.print(f"[red]{escape(line)}[/]")


def _diagnosis(job: Job) -> dict[str, str]:
    """The job's verdict (the API's `diagnosis`: docs/user-guide/why.md) as printable text, {} when it has none: its
    words come from the job's own output, so terminal escapes are stripped."""
    diagnosis = job.get("diagnosis")
    if not isinstance(diagnosis, dict) or not diagnosis or job.get("state") not in TERMINAL_STATES:
        return {}
    return {key: printable(str(diagnosis.get(key) or "")) for key in ("title", "message", "hint")}


def _print_verdict(job: Job) -> None:
    """`tfdash status`: why the job failed, in three lines (title, message, hint)."""
    diagnosis = _diagnosis(job)
    if not diagnosis:
        return
    out.print(f"  [red]why:[/] [bold]{escape(diagnosis['title'] or 'the cause was not recognised')}[/]")
    if diagnosis["message"]:
        out.print(f"    {escape(diagnosis['message'])}")
    if diagnosis["hint"]:
        out.print(f"    what to do: {escape(diagnosis['hint'])}")


def verdict_line(job: Job) -> str:
    """`--wait`'s last line for a job that failed or timed out: its verdict in one line; "" without one."""
    diagnosis = _diagnosis(job)
    if not diagnosis:
        return ""
    said = (diagnosis["message"] or diagnosis["title"] or "the cause was not recognised").rstrip()
    line = f"why job {job.get('id')} {job.get('state')}: {said}"
    if not diagnosis["hint"]:
        return line
    return f"{line}{'' if said.endswith(('.', '!', '?')) else '.'} What to do: {diagnosis['hint']}"


def _plan_table(plan: dict[str, Any]) -> Table:
    fits = "fits now" if plan.get("fits_now") else f"does not fit now: {plan.get('reason')}"
    table = Table("task", "host", "port", "devices", title=fits, box=None)
    for t in plan.get("tasks", []):
        table.add_row(task_label(t), str(t.get("host")), str(t.get("port") or "-"), str(t.get("devices")))
    return table


def _experiments_table(items: list[dict[str, Any]]) -> Table:
    table = Table("id", "name", "state", "variants", "created", box=None)
    for e in items:
        table.add_row(
            str(e.get("id")),
            escape(str(e.get("name"))),
            _state(str(e.get("state"))),
            str(len(e.get("variants") or [])),
            str(e.get("created_at", ""))[:19].replace("T", " "),
        )
    return table


def _experiment_detail(e: dict[str, Any]) -> Table:
    out.print(f"experiment {e.get('id')} [bold]{escape(str(e.get('name')))}[/]: {_state(str(e.get('state')))}")
    verdict = (e.get("summary") or {}).get("verdict")
    if verdict:
        out.print(f"  {escape(str(verdict))}")
    table = Table("job", "variant", "state", box=None)
    for j in e.get("jobs") or []:
        table.add_row(str(j.get("id")), escape(str(j.get("variant"))), _state(str(j.get("state"))))
    return table


def _artifacts_table(listing: list[dict[str, Any]]) -> Table:
    table = Table("name", "size", "sha256", box=None)
    for a in listing:
        table.add_row(escape(str(a.get("name"))), str(a.get("size")), str(a.get("sha256", ""))[:16])
    return table


def _print_refusal(exc: Refused) -> None:
    err.print("[red]The server refused the job:[/]")
    for field, messages in exc.errors.items():
        option = fields.option_for_field(field)
        text = " ".join(map(str, messages)) if isinstance(messages, list) else error_text({"": messages})
        err.print(f"  {option + ': ' if option else ''}{escape(text)}")


_COLOURS = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "running": "cyan", "restarting": "magenta",
            "timed_out": "red", "preempted": "magenta"}  # fmt: skip


def _state(state: str) -> str:
    colour = _COLOURS.get(state)
    return f"[{colour}]{state}[/]" if colour else state


def _code(task: Mapping[str, Any]) -> str:
    return "-" if task.get("exit_code") is None else str(task["exit_code"])


def _rows(body: Any) -> list[dict[str, Any]]:
    """The queue API's answer as rows, whether it is a list or an object holding one."""
    if isinstance(body, dict):
        for key in ("results", "jobs", "queue", "waiting"):
            if isinstance(body.get(key), list):
                body = body[key]
                break
    return [row for row in body if isinstance(row, dict)] if isinstance(body, list) else []
