"""The `tfdash` commands themselves (login, submit, wait, ls, status, logs, cancel, queue, experiment, artifacts,
tensorboard): each takes its parsed options and a way to get a Client, and returns its exit code (exit_codes.py)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.table import Table

from tfdash import config, fields
from tfdash.api_types import Job, task_label
from tfdash.cli_args import Usage, _variant, _widths
from tfdash.cli_output import (
    _artifacts_table,
    _code,
    _experiment_detail,
    _experiments_table,
    _jobs_table,
    _json,
    _plan_table,
    _print_job,
    _print_outcome,
    _print_refusal,
    _rows,
    _show,
    err,
    out,
)
from tfdash.client import Client
from tfdash.errors import NotFound, Refused, Unsupported
from tfdash.exit_codes import JOB_FAILED, OK, OUTCOMES, REFUSED
from tfdash.progress import JobWatch
from tfdash.signout import sign_out
from tfdash.terminal import printable


# --- commands ---------------------------------------------------------------------------------------------------
def login(ns: argparse.Namespace, _client: Callable[[], Client]) -> int:
    url = ns.server.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise Usage(f"give the server's address with its scheme, e.g. https://{url}")
    username = ns.username or input("Username: ").strip()
    if ns.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass("Password: ")
    if not username or not password:
        raise Usage("a username and a password are needed")
    token = Client.obtain_token(url, username, password, name=f"tfdash CLI on {socket.gethostname()}"[:100])
    where = config.save(config.Stored(url=url, token=token, username=username))
    err.print(f"Logged in to {escape(url)} as {escape(username)}; token stored in {where} (readable by you only).")
    return OK


def logout(ns: argparse.Namespace, _client: Callable[[], Client]) -> int:
    err.print(escape(sign_out(local_only=ns.local)))
    return OK


def submit(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    if (ns.script is None) == (ns.builtin is None):
        raise Usage("give a SCRIPT to upload, or --builtin PROGRAM (not both)")
    try:
        env = fields.parse_env(ns.env or [])
    except argparse.ArgumentTypeError as exc:
        raise Usage(str(exc)) from None
    job_fields = {o.dest: getattr(ns, o.dest) for o in ns.options if o.target == "field"}
    run_config = {o.dest: getattr(ns, o.dest) for o in ns.options if o.target == "config"}
    run_config = {k: v for k, v in run_config.items() if v is not None}
    if "hidden" in run_config:
        run_config["hidden"] = _widths(run_config["hidden"])
    if ns.script is not None and any(k in run_config for k in fields.DATA["program_keys"]):
        raise Usage("--hidden, --data-path, --examples, --features and --classes are for --builtin programs")
    with client() as api:
        try:
            result = api.submit(
                ns.script,
                name=job_fields.pop("name", None),
                args=list(ns.args or []),
                env=env,
                builtin=ns.builtin,
                config=run_config,
                plan=ns.plan,
                **job_fields,
            )
        except Refused as exc:
            _print_refusal(exc)
            return REFUSED
        if ns.plan:
            return _show(ns, result, _plan_table)
        job: Job = result  # type: ignore[assignment]
        if not ns.wait:
            if ns.json:
                _json(job)
            else:
                out.print(f"job {job['id']} {job.get('state', 'queued')} on cluster {job.get('cluster_name', '?')}")
            return OK
        err.print(f"job {job['id']} submitted; waiting (Ctrl-C stops waiting, not the job)")
        return _wait(ns, api, job["id"])


def wait(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        return _wait(ns, api, ns.id)


def _wait(ns: argparse.Namespace, api: Client, job_id: int) -> int:
    watch = JobWatch(api, job_id, err)
    final = watch.run(poll_s=ns.poll)
    if ns.json:
        _json(final)
    else:
        _print_outcome(final)
    return OUTCOMES.get(str(final.get("state")), JOB_FAILED)


def ls(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        jobs = api.jobs(state=ns.state, limit=ns.limit)
    return _show(ns, jobs, _jobs_table)


def status(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        job = api.job(ns.id)
        tasks = api.tasks(ns.id)
    if ns.json:
        _json({**job, "tasks": tasks})
        return OK
    _print_job(job)
    table = Table("task", "host", "port", "state", "exit", box=None)
    for t in tasks:
        table.add_row(task_label(t), str(t.get("host") or "-"), str(t.get("port") or "-"), t.get("state", ""), _code(t))
    if tasks:
        out.print(table)
    return OK


def logs(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        if ns.follow:
            lines = api.follow_logs(ns.id, task=ns.task, poll_s=ns.poll, raw=ns.raw)
        else:
            lines = api.logs(ns.id, task=ns.task, raw=ns.raw)
        several = ns.task is None
        # The server sends each line as a terminal shows it (a progress bar at its last state) unless --raw. A task's
        # output may still hold what a terminal acts on (a C1 control, a bidirectional override; an older server
        # sends lines as written): stripped unless --raw. JSON needs nothing: json.dumps escapes every control.
        shown = (lambda text: text) if ns.raw else printable
        for line in lines:
            if ns.json:
                print(json.dumps(line), flush=True)
            elif several:
                print(f"[{line['task']}] {shown(line['text'])}", flush=True)
            else:
                print(shown(line["text"]), flush=True)
    return OK


def cancel(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        try:
            job = api.cancel(ns.id)
        except Refused as exc:
            err.print(f"[red]Not cancelled:[/] {escape(str(exc))}")
            return REFUSED
    if ns.json:
        _json(job)
    else:
        out.print(f"job {job['id']} {job.get('state')}")
    return OK


# The queue API's columns a terminal has room for (like squeue --start); --json has them all.
QUEUE_COLUMNS = (
    "position", "id", "name", "owner", "priority", "fair_share", "state", "devices", "time_limit_s", "expected_start",
)  # fmt: skip


def queue(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        clusters = api.clusters()
        if ns.cluster is not None:
            clusters = [c for c in clusters if str(c.get("id")) == ns.cluster or c.get("name") == ns.cluster]
            if not clusters:
                raise NotFound(f"No cluster {ns.cluster!r}.")
        queues = {str(c.get("name")): api.queue(int(c["id"])) for c in clusters}
        classes = [] if ns.json else _priority_classes(api)
    if ns.json:
        _json(queues)
        return OK
    for name, body in queues.items():
        rows = _rows(body)
        out.print(f"[bold]{escape(name)}[/]: {len(rows)} waiting")
        if rows:
            columns = [c for c in QUEUE_COLUMNS if c in rows[0]] or [
                c for c in rows[0] if not isinstance(rows[0][c], dict | list)
            ][:9]
            table = Table(*columns, box=None)
            for row in rows:
                table.add_row(*(escape(str(row.get(c, ""))) for c in columns))
            out.print(table)
    if classes:
        # Who may submit at each class (the queue page shows the same): a refusal at submit is no surprise.
        out.print("[bold]priority classes[/]")
        table = Table("class", "value", "preemptible", "who may use it", "you", box=None)
        for c in classes:
            table.add_row(
                *(escape(printable(str(c.get(key, "")))) for key in ("name", "value")),
                "yes" if c.get("preemptible") else "no",
                escape(printable(str(c.get("who", "")))),
                "may use" if c.get("you_may_use") else "may not use",
            )
        out.print(table)
    return OK


def _priority_classes(api: Client) -> list[dict[str, Any]]:
    try:
        return api.priority_classes()
    except Unsupported:  # an older server: its queue alone
        return []


def experiment(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        if ns.action == "show":
            if ns.id is None:
                return _show(ns, api.experiments(), _experiments_table)
            return _show(ns, api.experiment(ns.id), _experiment_detail)
        if ns.builtin is None or not ns.variant or ns.name is None:
            raise Usage("experiment create needs --name, --builtin PROGRAM and two or more --variant")
        try:
            env = fields.parse_env(ns.env or [])
            variants = [_variant(v) for v in ns.variant]
        except argparse.ArgumentTypeError as exc:
            raise Usage(str(exc)) from None
        run_config = {o.dest: getattr(ns, o.dest) for o in ns.options if getattr(ns, o.dest) is not None}
        body = {
            "name": ns.name,
            "builtin": ns.builtin,
            "builtin_config": run_config,
            "env": env,
            "variants": variants,
            "mode": ns.mode,
            "target_accuracy": ns.target_accuracy,
        }
        try:
            created = api.create_experiment(body)
        except Refused as exc:
            _print_refusal(exc)
            return REFUSED
    if ns.json:
        _json(created)
    else:
        out.print(
            f"experiment {created['id']} started: jobs {', '.join(str(j['id']) for j in created.get('jobs', []))}"
        )
    return OK


def artifacts(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        listing = api.artifacts(ns.id)
        if ns.download:
            wanted = [a for a in listing if ns.name is None or a["name"] == ns.name]
            if ns.name is not None and not wanted:
                raise NotFound(f"Job {ns.id} has no artifact {ns.name!r}.")
            os.makedirs(ns.to, exist_ok=True)
            saved = [str(api.download_artifact(ns.id, a["name"], ns.to)) for a in wanted]
            if ns.json:
                _json(saved)
            else:
                for path in saved:
                    out.print(path)
            return OK
    return _show(ns, listing, _artifacts_table)


def tensorboard(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        try:
            logdir = api.tensorboard(ns.id, ns.to)
        except FileExistsError as exc:
            raise Usage(str(exc)) from None
    if ns.json:
        _json({"logdir": str(logdir)})
    else:
        err.print(f"job {ns.id}'s metrics written as a TensorBoard logdir; to look at them:")
        out.print(f"tensorboard --logdir {shlex.quote(str(logdir))}")
    return OK
