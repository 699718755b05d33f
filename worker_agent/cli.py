"""`python -m worker_agent --server REDIS_URL --host NAME --token-file FILE --control-key KEY [--port-range A-B]
[--workdir DIR] [--task-uids A-B] [--shared-root DIR ...]`.

The token comes from a file (mode 0600) or env TFDASH_AGENT_TOKEN, never a flag (a flag shows in `ps`); the variable
is removed from this process's environment at once, so no child inherits it, and only the key derived from the token
is kept. The agent signs in to the broker as its host's own Redis user, with a password derived from that key
(contracts/broker.py), so `--server` carries no user or password. `--control-key` is the control plane's public key,
given at registration: every order must be signed by it.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from contracts import broker
from contracts.names import HOST_NAME_RULE, is_host_name
from contracts.signing import agent_mac_key, load_public_key
from worker_agent import __version__
from worker_agent.app import Agent
from worker_agent.sampler import DEFAULT_INTERVAL_S, MAX_INTERVAL_S, MIN_INTERVAL_S
from worker_agent.supervision import identity
from worker_agent.supervision.workspace import SHARED_ROOT_ENV

log = logging.getLogger("worker_agent")


TOKEN_ENV = "TFDASH_AGENT_TOKEN"  # noqa: S105 - a variable's name


def take_from_environment(name: str) -> str:
    """The variable's value, then gone from this process's environment before anything else runs: from os.environ,
    so no child process (a task, a tool) inherits it, and overwritten in the block the kernel shows as
    /proc/<pid>/environ, which unsetting alone leaves as it was at exec (Linux with glibc; elsewhere, only the
    first)."""
    value = os.environ.get(name, "")
    if value:
        _overwrite_initial_entry(name)
    os.environ.pop(name, None)
    return value


def _overwrite_initial_entry(name: str) -> None:
    try:
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError, AttributeError):
        return
    prefix = name.encode() + b"="
    index = 0
    while environ[index]:
        address = environ[index]
        entry = ctypes.string_at(address)
        if entry.startswith(prefix):  # same length, so nothing else in the block moves
            ctypes.memset(address + len(prefix), ord("x"), len(entry) - len(prefix))
        index += 1


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
        prog="python -m worker_agent",
        description="Run the tfdash agent for one training host.",
        # No prefixes: `--token X` (the removed flag, which showed the token in `ps`) must fail, not mean --token-file.
        allow_abbrev=False,
    )
    parser.add_argument(
        "--server",
        default=os.environ.get("TFDASH_SERVER", "redis://127.0.0.1:6379/0"),
        help="Redis URL of the control plane, without user or password (env TFDASH_SERVER)",
    )
    parser.add_argument("--host", required=True, type=host_name, help="this host's name as registered")
    parser.add_argument(
        "--token-file",
        type=Path,
        help="read this host's agent token from this file (mode 0600; or env TFDASH_AGENT_TOKEN)",
    )
    parser.add_argument(
        "--control-key",
        default=os.environ.get("TFDASH_CONTROL_PUBLIC_KEY", ""),
        help="the control plane's public key, as the admin shows it (env TFDASH_CONTROL_PUBLIC_KEY)",
    )
    parser.add_argument("--control-key-file", type=Path, help="read the control plane's public key from this file")
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
    parser.add_argument(
        "--shared-root",
        dest="shared_roots",
        action="append",
        type=Path,
        default=None,
        help="the cluster's shared folder (repeatable): a job folder an order names must lie under it or under the "
        f"workdir, else the launch is refused (env {SHARED_ROOT_ENV}, several separated by ':')",
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
    token = take_from_environment(TOKEN_ENV)
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            parser.error(f"cannot read --token-file {args.token_file}: {exc.strerror}")
    if not token:
        parser.error("an agent token is required: --token-file FILE or env TFDASH_AGENT_TOKEN (shown once in admin)")
    # Only the derived key is kept: the token itself is not stored on `args` or anywhere else.
    args.mac_key = agent_mac_key(token, args.host)
    del token
    try:
        args.broker_url = broker.server_url(args.server, args.host, broker.password(args.mac_key, args.host))
    except ValueError as exc:
        parser.error(f"--server: {exc}")
    if args.control_key_file is not None:
        try:
            args.control_key = args.control_key_file.read_text()
        except OSError as exc:
            parser.error(f"cannot read --control-key-file {args.control_key_file}: {exc.strerror}")
    if not args.control_key:
        parser.error("the control plane's public key is required: --control-key, --control-key-file or env "
                     "TFDASH_CONTROL_PUBLIC_KEY (the admin shows it with the token)")  # fmt: skip
    try:
        args.control_key = load_public_key(args.control_key)
    except ValueError as exc:
        parser.error(f"--control-key: {exc}")
    if not 0.1 <= args.heartbeat_interval <= 60:
        parser.error("--heartbeat-interval must be between 0.1 and 60 seconds")
    if not MIN_INTERVAL_S <= args.sample_interval <= MAX_INTERVAL_S:  # also refuses nan
        parser.error(f"--sample-interval must be between {MIN_INTERVAL_S:g} and {MAX_INTERVAL_S:g} seconds")
    if args.workdir is None:
        args.workdir = Path.home() / ".cache" / "tfdash-agent" / args.host
    args.workdir = Path(args.workdir).expanduser()
    if args.shared_roots is None:
        args.shared_roots = [Path(p) for p in os.environ.get(SHARED_ROOT_ENV, "").split(os.pathsep) if p]
    for root in args.shared_roots:
        if not root.is_absolute():
            parser.error(f"--shared-root {root}: must be an absolute path")
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
        identity.prepare(args.task_uids, args.workdir.resolve(), args.token_file, args.shared_roots)
    except (identity.Unusable, OSError) as exc:
        log.error("refusing to start: %s", exc)
        return 2
    agent = Agent(
        server=args.broker_url,
        host=args.host,
        mac_key=args.mac_key,
        control_key=args.control_key,
        workdir=args.workdir,
        port_range=args.port_range,
        heartbeat_interval_s=args.heartbeat_interval,
        sample_interval_s=args.sample_interval,
        task_uids=args.task_uids,
        shared_roots=args.shared_roots,
    )
    log.info("agent %s work directory: %s", __version__, args.workdir)
    return agent.run(loglevel=args.log_level)


if __name__ == "__main__":
    sys.exit(main())
