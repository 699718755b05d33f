"""Each `tfdash` command's argument parser, and the command it runs: the job's options come from the server's own
field definitions (tfdash/job_fields.json, tfdash.fields)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from tfdash import fields
from tfdash.cli_args import _poll, _positive
from tfdash.cli_commands import (
    artifacts,
    cancel,
    experiment,
    login,
    logout,
    logs,
    ls,
    queue,
    status,
    submit,
    tensorboard,
    wait,
)
from tfdash.cli_usage import usage
from tfdash.client import Client

Command = Callable[[argparse.Namespace, Callable[[], Client]], int]


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
        help="print the lines as the tasks wrote them: every redraw of a progress bar, terminal escape sequences "
        "included (by default each line is shown as a terminal would leave it, a progress bar at its last state, and "
        "escapes are removed: a script's output could otherwise write your clipboard or retitle your terminal)",
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

    p = _parser(
        "usage",
        "Device-hours per user, group or cluster for a period of UTC days (GET /api/usage/): ended tasks and running "
        "ones so far. You see your own usage and your groups' (staff: everyone's).",
    )
    p.add_argument("--from", dest="start", metavar="YYYY-MM-DD", help="the first day (default: 29 days before --to)")
    p.add_argument("--to", dest="end", metavar="YYYY-MM-DD", help="the last day, inclusive (default: today, UTC)")
    p.add_argument("--by", choices=("user", "group", "cluster"), default="user", help="one row per (default: user)")
    p.add_argument("--user", help="only this user's usage")
    p.add_argument("--group", help="only this group's members' usage")
    p.add_argument("--cluster", help="only this cluster's usage (by name)")
    p.add_argument("--daily", action="store_true", help="also print each day's rows")
    _reads_json(p)
    parsers["usage"] = (p, usage, False)
    return parsers
