"""The `tfdash` command: submit, watch and fetch tf.distribute jobs from a terminal, over the REST API
(tfdash.client). `tfdash --help` lists the commands, `tfdash COMMAND --help` each one's options; the job's options
come from the server's own field definitions (tfdash/job_fields.json)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tfdash import __version__, config, fields
from tfdash.client import (
    AuthError,
    Client,
    Job,
    NotFound,
    Refused,
    TfdashError,
    Unreachable,
    Unsupported,
    error_text,
    task_label,
)
from tfdash.progress import JobWatch
from tfdash.signout import sign_out
from tfdash.terminal import printable

# Exit codes a shell script can test (README, "Command line").
OK = 0
JOB_FAILED = 1  # --wait: the job ended failed
USAGE = 2  # a bad command line or input, refused before anything was sent (argparse's own code)
AUTH = 3  # not logged in, or the token or password was refused
NOT_FOUND = 4  # no such job, task, experiment, cluster or artifact (or another user's)
REFUSED = 5  # the server refused the request: the job cannot run as given, or it already ended (cancel)
UNREACHABLE = 6  # no answer from the server, or a server error
UNSUPPORTED = 7  # the server does not offer this command's API
JOB_CANCELLED = 8  # --wait: the job was cancelled
JOB_TIMED_OUT = 9  # --wait: the job reached its time limit
INTERRUPTED = 130  # Ctrl-C (a job being waited for goes on running)

EXIT_CODES = f"""exit codes:
  {OK}    done; with --wait: the job succeeded
  {JOB_FAILED}    --wait: the job failed
  {USAGE}    bad command line or input (nothing was sent)
  {AUTH}    not logged in, or the token or password was refused
  {NOT_FOUND}    no such job, task, experiment, cluster or artifact (or not yours)
  {REFUSED}    the server refused the request (the job cannot run as given; cancel: it already ended)
  {UNREACHABLE}    the server did not answer, or failed
  {UNSUPPORTED}    the server does not offer this command's API
  {JOB_CANCELLED}    --wait: the job was cancelled
  {JOB_TIMED_OUT}    --wait: the job reached its time limit (timed out)
  {INTERRUPTED}  interrupted (Ctrl-C); a job being waited for goes on running"""

OUTCOMES = {"succeeded": OK, "failed": JOB_FAILED, "cancelled": JOB_CANCELLED, "timed_out": JOB_TIMED_OUT}
ERRORS: dict[type[TfdashError], int] = {
    AuthError: AUTH,
    NotFound: NOT_FOUND,
    Refused: REFUSED,
    Unreachable: UNREACHABLE,
    Unsupported: UNSUPPORTED,
}

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
Command = Callable[[argparse.Namespace, Callable[[], Client]], int]


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
        lines = api.follow_logs(ns.id, task=ns.task, poll_s=ns.poll) if ns.follow else api.logs(ns.id, task=ns.task)
        several = ns.task is None
        # A task's output may hold terminal escapes (a clipboard write, a title change): stripped unless --raw.
        # JSON needs nothing: json.dumps writes every control character as an escape.
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
QUEUE_COLUMNS = ("position", "id", "name", "owner", "priority", "state", "devices", "time_limit_s", "expected_start")


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


# --- the command line -------------------------------------------------------------------------------------------
class Usage(Exception):
    """A bad command line or input: said on stderr, exit code USAGE."""


def _parser(name: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"tfdash {name}", description=description)


def _reads_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of a table")


def _job_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", type=_positive, metavar="ID", help="the job's id")


def build_parsers() -> dict[str, tuple[argparse.ArgumentParser, Command, bool]]:
    """command -> (its parser, its function, whether its positionals and options may interleave)."""
    parsers: dict[str, tuple[argparse.ArgumentParser, Command, bool]] = {}

    p = _parser("login", "Sign in to a tfdash server and store an API token in your config folder (0600).")
    p.add_argument("server", metavar="URL", help="the server, e.g. https://tfdash.example.org")
    p.add_argument("--username", "-u", help="asked for when not given")
    p.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    parsers["login"] = (p, login, False)

    p = _parser("logout", "Revoke the stored token on its server, then remove it from this machine.")
    p.add_argument("--local", action="store_true", help="only remove it here (it stays valid until it expires)")
    parsers["logout"] = (p, logout, False)

    p = _parser(
        "submit",
        "Upload a script (or name a built-in program) and submit it as a job. Arguments after SCRIPT go to the "
        "script; put those starting with '-' after '--', e.g. tfdash submit train.py --workers 2 -- --lr 0.1",
    )
    p.add_argument("script", nargs="?", metavar="SCRIPT", help="the training script (.py) to upload")
    p.add_argument("args", nargs="*", metavar="ARGS", help="arguments for the script")
    p.add_argument("--builtin", choices=sorted(fields.BUILTIN_PROGRAMS), help="run a built-in program instead")
    options = fields.add_options(p, fields.JOB_FIELDS, "field")
    options += fields.add_options(p, fields.HYPERPARAMETERS, "config")
    options += fields.add_options(p, fields.PROGRAM_FIELDS, "config")
    p.add_argument(
        "--env",
        action="append",
        metavar="NAME=VALUE",
        help="an environment variable every task gets (repeat for more); reserved names are refused",
    )
    p.add_argument("--plan", action="store_true", help="only validate and print the placement and TF_CONFIGs")
    p.add_argument("--wait", action="store_true", help="wait for the job to end, showing progress and loss")
    p.add_argument("--poll", type=_poll, default=1.0, help=argparse.SUPPRESS)
    _reads_json(p)
    p.set_defaults(options=options)
    parsers["submit"] = (p, submit, True)

    p = _parser("wait", "Wait for a job to end, showing its progress and loss; the exit code is its outcome.")
    _job_id(p)
    p.add_argument("--poll", type=_poll, default=1.0, help=argparse.SUPPRESS)
    _reads_json(p)
    parsers["wait"] = (p, wait, False)

    p = _parser("ls", "Your jobs (staff: everyone's), newest first.")
    p.add_argument("--state", help="only jobs in this state (queued, running, succeeded, failed, ...)")
    p.add_argument("--limit", type=_positive, default=50, help="at most this many (default 50)")
    _reads_json(p)
    parsers["ls"] = (p, ls, False)

    p = _parser("status", "A job's state, reason, failure and tasks.")
    _job_id(p)
    _reads_json(p)
    parsers["status"] = (p, status, False)

    p = _parser("logs", "A job's log lines (every task's, or one task's).")
    _job_id(p)
    p.add_argument("--task", help="only this task, e.g. worker:0 or chief:0 (or its id)")
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing new lines until the job ends (a job still waiting for its placement is waited for)",
    )
    p.add_argument("--poll", type=_poll, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="one JSON object per line: task, task_id, seq, stream, text")
    p.add_argument(
        "--raw",
        action="store_true",
        help="print the lines as the tasks wrote them, terminal escape sequences included (by default they are "
        "removed: a script's output could otherwise write your clipboard or retitle your terminal)",
    )
    parsers["logs"] = (p, logs, False)

    p = _parser("cancel", "Cancel a job: its tasks are stopped.")
    _job_id(p)
    _reads_json(p)
    parsers["cancel"] = (p, cancel, False)

    p = _parser("queue", "The jobs waiting on each cluster, in order (GET /api/clusters/<id>/queue/).")
    p.add_argument("--cluster", help="one cluster, by name or id (default: every cluster)")
    _reads_json(p)
    parsers["queue"] = (p, queue, False)

    p = _parser("experiment", "Compare strategies: create an experiment, or show one (or all).")
    p.add_argument("action", choices=("create", "show"))
    p.add_argument("id", nargs="?", type=_positive, metavar="ID", help="show: the experiment (default: list them)")
    p.add_argument("--name")
    p.add_argument("--builtin", choices=sorted(fields.BUILTIN_PROGRAMS), help="the built-in program every run runs")
    p.add_argument(
        "--variant",
        action="append",
        metavar="STRATEGY:WORKERS:PS:DEVICES",
        help="a strategy and shape to compare, e.g. mirrored:1:0:2 (two or more)",
    )
    p.add_argument("--mode", choices=("sequential", "parallel"), default="sequential")
    p.add_argument("--target-accuracy", type=float, default=0.9)
    p.add_argument("--env", action="append", metavar="NAME=VALUE", help="an environment variable every task gets")
    options = fields.add_options(p, fields.HYPERPARAMETERS, "config")
    _reads_json(p)
    p.set_defaults(options=options)
    parsers["experiment"] = (p, experiment, False)

    p = _parser("artifacts", "A job's artifacts (the saved model, ...), listed or downloaded.")
    _job_id(p)
    p.add_argument("--download", action="store_true", help="download them (checked against their SHA-256)")
    p.add_argument("--name", help="only this artifact")
    p.add_argument("--to", default=".", help="the folder to save into (default: here)")
    _reads_json(p)
    parsers["artifacts"] = (p, artifacts, False)

    p = _parser(
        "tensorboard",
        "Write a job's stored metrics as a TensorBoard logdir (one run per task and phase) and print the "
        "`tensorboard --logdir` line that shows them. An earlier export of the job there is replaced.",
    )
    _job_id(p)
    p.add_argument("--to", default=".", help="the folder to write job<ID>/ into (default: here)")
    _reads_json(p)
    parsers["tensorboard"] = (p, tensorboard, False)
    return parsers


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parsers = build_parsers()
    top = argparse.ArgumentParser(
        prog="tfdash",
        description="Submit, watch and fetch tf.distribute jobs on a tfdash server.",
        epilog="commands: " + ", ".join(parsers) + "\n(tfdash COMMAND --help for each)\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--url", help="the server (default: the one `tfdash login` stored; env TFDASH_URL)")
    top.add_argument("--version", action="version", version=f"tfdash {__version__}")
    top.add_argument("command", choices=list(parsers), metavar="COMMAND")
    top.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = top.parse_args(args)
    parser, command, intermixed = parsers[ns.command]
    sub = parser.parse_intermixed_args(ns.rest) if intermixed else parser.parse_args(ns.rest)
    url = ns.url

    def client() -> Client:
        return Client.from_config(url)

    try:
        return command(sub, client)
    except Usage as exc:
        err.print(f"tfdash {ns.command}: error: {escape(str(exc))} (see tfdash {ns.command} --help)")
        return USAGE
    except TfdashError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return next((code for kind, code in ERRORS.items() if isinstance(exc, kind)), UNREACHABLE)
    except KeyboardInterrupt:
        err.print("interrupted")
        return INTERRUPTED
    except BrokenPipeError:  # `tfdash logs 3 | head`: the reader left; nothing more to say
        sys.stderr.close()
        return OK


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
    table = Table("id", "name", "state", "strategy", "shape", "owner", "created", box=None)
    for job in jobs:
        shape = f"{job.get('workers')}w" + (f"+{job.get('ps')}ps" if job.get("ps") else "")
        shape += f" × {job.get('devices_per_worker')}"
        table.add_row(
            str(job.get("id")),
            escape(str(job.get("name"))),
            _state(str(job.get("state"))),
            str(job.get("strategy")),
            shape,
            escape(str(job.get("owner"))),
            str(job.get("created_at", ""))[:19].replace("T", " "),
        )
    return table


def _print_job(job: Job) -> None:
    out.print(f"job {job.get('id')} [bold]{escape(str(job.get('name')))}[/]: {_state(str(job.get('state')))}")
    shape = f"{job.get('workers')} worker(s)" + (f" + {job.get('ps')} ps" if job.get("ps") else "")
    out.print(
        f"  {job.get('strategy')}, {shape} × {job.get('devices_per_worker')} device(s), cluster "
        f"{escape(str(job.get('cluster_name')))}, attempt {job.get('attempt')}, restarts {job.get('restarts')}"
    )
    if job.get("reason"):
        out.print(f"  reason: {escape(str(job['reason']))}")
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


def _print_outcome(job: Job) -> None:
    _print_job(job)


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


# --- argument types ---------------------------------------------------------------------------------------------
def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive whole number, not {text!r}")
    return int(text)


def _poll(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds, not {text!r}") from None
    if not 0.05 <= value <= 60:
        raise argparse.ArgumentTypeError("between 0.05 and 60 seconds")
    return value


def _widths(text: str) -> list[int]:
    try:
        return [int(w) for w in text.replace(",", " ").split()]
    except ValueError:
        raise Usage(f"--hidden takes layer widths, e.g. 256,256, not {text!r}") from None


def _variant(text: str) -> dict[str, Any]:
    parts = text.split(":")
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(
            f"--variant takes STRATEGY:WORKERS:PS:DEVICES, e.g. mirrored:1:0:2, not {text!r}"
        )
    strategy, workers, ps, devices = parts
    return {"strategy": strategy, "workers": int(workers), "ps": int(ps), "devices_per_worker": int(devices)}


if __name__ == "__main__":
    raise SystemExit(main())
