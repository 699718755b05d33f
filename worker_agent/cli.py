"""`python -m worker_agent --server REDIS_URL --host NAME --token TOKEN [--port-range A-B] [--workdir DIR]
[--task-uids A-B]`."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from contracts.names import HOST_NAME_RULE, is_host_name
from worker_agent import __version__
from worker_agent.app import Agent
from worker_agent.sampler import DEFAULT_INTERVAL_S, MAX_INTERVAL_S, MIN_INTERVAL_S
from worker_agent.supervision import identity

log = logging.getLogger("worker_agent")


def port_range(value: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)-(\d+)", value.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port range like 23000-23099")
    low, high = int(match[1]), int(match[2])
    if not (1024 <= low <= high <= 65535):
        raise argparse.ArgumentTypeError(f"{value!r}: ports must satisfy 1024 <= first <= last <= 65535")
    return low, high


def uid_range(value: str) -> identity.UidRange:
    try:
        return identity.parse_range(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def host_name(value: str) -> str:
    if not is_host_name(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a host name ({HOST_NAME_RULE})")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m worker_agent", description="Run the tfdash agent for one training host."
    )
    parser.add_argument(
        "--server",
        default=os.environ.get("TFDASH_SERVER", "redis://127.0.0.1:6379/0"),
        help="Redis URL of the control plane (env TFDASH_SERVER)",
    )
    parser.add_argument("--host", required=True, type=host_name, help="this host's name as registered")
    parser.add_argument(
        "--token",
        default=os.environ.get("TFDASH_AGENT_TOKEN", ""),
        help="this host's agent token (prefer env TFDASH_AGENT_TOKEN: a flag shows in `ps`)",
    )
    parser.add_argument("--token-file", type=Path, help="read the token from this file (e.g. a mounted secret)")
    parser.add_argument("--port-range", type=port_range, default=None, help="ports TF tasks may use, e.g. 23000-23099")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=os.environ.get("TFDASH_AGENT_WORKDIR") or None,
        help="scripts and task folders (env TFDASH_AGENT_WORKDIR; default ~/.cache/tfdash-agent/HOST)",
    )
    parser.add_argument(
        "--task-uids",
        type=uid_range,
        # A string default goes through `type` too, so a malformed env value is refused like a malformed flag.
        default=os.environ.get(identity.TASK_UIDS_ENV) or None,
        help="agent running as root: run each job's processes under its own user id from this range, e.g. "
        f"20000-29999, used by no account of this machine (env {identity.TASK_UIDS_ENV})",
    )
    parser.add_argument("--heartbeat-interval", type=float, default=3.0, help="seconds between heartbeats")
    parser.add_argument(
        "--sample-interval",
        type=float,
        # A string default goes through `type` too, so a malformed env value is refused like a malformed flag.
        default=os.environ.get("TFDASH_SAMPLE_INTERVAL", str(DEFAULT_INTERVAL_S)),
        help="seconds between host CPU/memory/GPU samples (env TFDASH_SAMPLE_INTERVAL; default 1)",
    )
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    parser.add_argument("--version", action="version", version=f"worker_agent {__version__}")
    args = parser.parse_args(argv)
    if args.token_file is not None:
        try:
            args.token = args.token_file.read_text().strip()
        except OSError as exc:
            parser.error(f"cannot read --token-file {args.token_file}: {exc.strerror}")
    if not args.token:
        parser.error("an agent token is required: --token or env TFDASH_AGENT_TOKEN (shown once in admin)")
    if not 0.1 <= args.heartbeat_interval <= 60:
        parser.error("--heartbeat-interval must be between 0.1 and 60 seconds")
    if not MIN_INTERVAL_S <= args.sample_interval <= MAX_INTERVAL_S:  # also refuses nan
        parser.error(f"--sample-interval must be between {MIN_INTERVAL_S:g} and {MAX_INTERVAL_S:g} seconds")
    if args.workdir is None:
        args.workdir = Path.home() / ".cache" / "tfdash-agent" / args.host
    args.workdir = Path(args.workdir).expanduser()
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s agent[%(threadName)s]: %(message)s")
    try:
        args.workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.error("cannot create the work directory %s: %s", args.workdir, exc.strerror)
        return 2
    try:
        identity.prepare(args.task_uids, args.workdir.resolve(), args.token_file)
    except (identity.Unusable, OSError) as exc:
        log.error("refusing to start: %s", exc)
        return 2
    agent = Agent(
        server=args.server,
        host=args.host,
        token=args.token,
        workdir=args.workdir,
        port_range=args.port_range,
        heartbeat_interval_s=args.heartbeat_interval,
        sample_interval_s=args.sample_interval,
        task_uids=args.task_uids,
    )
    log.info("agent %s work directory: %s", __version__, args.workdir)
    return agent.run(loglevel=args.log_level)


if __name__ == "__main__":
    sys.exit(main())
