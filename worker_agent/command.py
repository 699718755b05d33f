"""`tfdash-agent`: the agent as an admin installs and runs it (`pip install ./agent`, agent/pyproject.toml).

    tfdash-agent join URL --host NAME --token-file FILE [--control-key KEY] [--config PATH] [--workdir DIR] [--force]
    tfdash-agent run [--config PATH] [--log-level LEVEL]

`join` asks the control plane at URL (contracts/join.py) for this host's configuration with a request sealed by the
host's key, as every agent message is (the token never travels), checks the signed answer against the control key
when the admin's command pins it (else takes the key the answer names, and says so), and writes it once to a file
only its user can read (mode 0600): CONFIG_ROOT as root, else CONFIG_USER. `run` starts the agent from that file
with `python -m worker_agent`'s own parser and checks (worker_agent/cli.py); the token is read from its file at every
start, never from a flag or the config.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from contracts.join import AGENT_JOIN, JOIN_PATH, MAX_ANSWER_BYTES, JoinConfig, config_from
from contracts.names import HOST_NAME_RULE, is_host_name
from contracts.signing import Refused, agent_mac_key, load_public_key, open_order, public_key_text, seal
from worker_agent import __version__, cli

log = logging.getLogger("worker_agent")

CONFIG_ROOT = Path("/etc/tfdash-agent/config.json")
CONFIG_USER = Path("~/.config/tfdash-agent/config.json")
WORKDIR_ROOT = Path("/var/lib/tfdash-agent")
MAX_CONFIG_BYTES = 64 * 1024
JOIN_TIMEOUT_S = 30.0


class Failed(Exception):
    """What to tell the admin, and nothing else (exit status 2)."""


def default_config() -> Path:
    return CONFIG_ROOT if os.geteuid() == 0 else CONFIG_USER.expanduser()


# --- join ------------------------------------------------------------------------------------------------------------
def join(
    url: str,
    host: str,
    token_file: Path,
    config_path: Path,
    *,
    control_key: str = "",
    workdir: Path | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Join the control plane at `url` and write this host's configuration to `config_path`; returns what was
    written. Raises Failed with the reason."""
    if config_path.exists() and not force:
        raise Failed(f"{config_path} exists already: this host has joined (run `tfdash-agent run`, or join --force)")
    base = _base_url(url)
    token_file = token_file.expanduser().resolve()
    mac_key = agent_mac_key(_read_token(token_file), host)
    pinned = _load_key(control_key, "--control-key") if control_key else None
    request = seal(mac_key, host, AGENT_JOIN, {"agent_version": __version__})
    answer = _post_json(base + JOIN_PATH, request)
    config = _check_answer(answer, host, pinned, plain_http=base.startswith("http:"))
    written = {
        "url": base,
        **asdict(config),
        "port_range": f"{config.port_range[0]}-{config.port_range[1]}",
        "token_file": str(token_file),
        "workdir": str(workdir.expanduser().resolve()) if workdir else (str(WORKDIR_ROOT) if os.geteuid() == 0 else ""),
        "joined_at": time.time(),
        "agent_version": __version__,
    }
    _write_private(config_path, json.dumps(written, indent=2) + "\n", replace=force)
    return written


def _base_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Failed(f"{url!r} is not the control plane's address (https://tfdash.example.org)")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise Failed(f"{url!r}: give the control plane's address alone, with no user, query or fragment")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _read_token(token_file: Path) -> str:
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise Failed(f"cannot read the token file {token_file}: {exc.strerror}") from None
    if not token:
        raise Failed(f"the token file {token_file} is empty: write the token the admin page showed into it")
    if token_file.stat().st_mode & 0o077:
        log.warning("the token file %s can be read by others: chmod 600 it", token_file)
    return token


def _load_key(text: str, what: str) -> Any:
    try:
        return load_public_key(text)
    except ValueError as exc:
        raise Failed(f"{what}: {exc}") from None


def _post_json(url: str, body: Any) -> Any:
    data = json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 - the scheme was checked: http or https only
        url, data=data, method="POST", headers={"Content-Type": "application/json", "Accept": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=JOIN_TIMEOUT_S) as response:  # noqa: S310
            raw = response.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        detail = _detail(exc.read(4096))
        raise Failed(f"the control plane refused the join ({exc.code}): {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Failed(f"cannot reach the control plane at {url}: {reason}") from None
    if len(raw) > MAX_ANSWER_BYTES:
        raise Failed(f"the answer from {url} is larger than {MAX_ANSWER_BYTES} bytes: not a join answer")
    try:
        return json.loads(raw)
    except ValueError:
        raise Failed(f"the answer from {url} is not JSON: is that the control plane's address?") from None


def _detail(raw: bytes) -> str:
    try:
        detail = json.loads(raw).get("detail", "")
    except (ValueError, AttributeError):
        detail = ""
    return str(detail)[:500] or raw.decode("utf-8", "replace")[:200]


def _check_answer(answer: Any, host: str, pinned: Any, *, plain_http: bool = False) -> JoinConfig:
    """The configuration in a signed answer, checked against the pinned control key, or (none pinned) against the
    key the answer itself names: then only TLS vouches for it, which the admin is told."""
    key = pinned
    if key is None:
        try:
            named = json.loads(answer["order"])["body"]["control_key"]
        except (TypeError, KeyError, ValueError):
            raise Failed("the join answer is not one: no signed configuration in it") from None
        key = _load_key(str(named), "the join answer's control key")
        log.warning(
            "no --control-key given: trusting the key the control plane sent (%s)%s; pin it with --control-key, as "
            "the admin page's command does, so that nothing on the way can swap it",
            public_key_text(key),
            ", over plain http at that" if plain_http else "",
        )
    try:
        order = open_order(answer, key, host, AGENT_JOIN)
        config = config_from(order.body)
    except Refused as exc:
        raise Failed(f"the join answer is not signed by the control key given: {exc.detail}") from None
    except ValueError as exc:
        raise Failed(str(exc)) from None
    if public_key_text(_load_key(config.control_key, "control_key")) != public_key_text(key):
        raise Failed("the join answer names another control key than the one given: refused")
    if config.host != host:
        raise Failed(f"the join answer is for host {config.host!r}, not {host!r}")
    return config


def _write_private(path: Path, text: str, *, replace: bool) -> None:
    """Write `text` to `path`, mode 0600, whole or not at all; its folder is made 0700 when missing."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(partial, path)
            return
        try:
            os.link(partial, path)  # fails when another join wrote it meanwhile: once means once
        finally:
            partial.unlink()
    except FileExistsError:
        raise Failed(f"{path} exists already: this host has joined") from None
    except OSError as exc:
        raise Failed(f"cannot write {path}: {exc.strerror}") from None


# --- run -------------------------------------------------------------------------------------------------------------
def read_config(path: Path) -> dict[str, Any]:
    path = path.expanduser()
    try:
        with path.open("rb") as source:
            raw = source.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise Failed(f"cannot read {path}: {exc.strerror} (run `tfdash-agent join URL ...` first)") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise Failed(f"{path} is larger than {MAX_CONFIG_BYTES} bytes: not an agent configuration")
    try:
        config = json.loads(raw)
        if not isinstance(config, dict):
            raise ValueError("not an object")
        config_from({**config, "port_range": _ports(config.get("port_range"))})
        for name in ("token_file", "workdir"):
            if not isinstance(config.get(name, ""), str):
                raise ValueError(f"{name} must be a path")
    except ValueError as exc:
        raise Failed(f"{path} is not an agent configuration: {exc}") from None
    return config


def _ports(value: Any) -> list[int]:
    low, _, high = str(value).partition("-")
    try:
        return [int(low), int(high)]
    except ValueError:
        raise ValueError(f"port_range must be like 23000-23099, not {str(value)[:40]!r}") from None


def agent_argv(config: dict[str, Any], log_level: str) -> list[str]:
    """`python -m worker_agent`'s arguments for this configuration (parsed and checked by worker_agent/cli.py)."""
    argv = ["--server", config["server"], "--host", config["host"], "--control-key", config["control_key"]]
    argv += ["--token-file", config["token_file"], "--port-range", config["port_range"]]
    argv += ["--heartbeat-interval", str(config.get("heartbeat_interval_s", 3.0)), "--log-level", log_level]
    if config.get("workdir"):
        argv += ["--workdir", config["workdir"]]
    for root in config.get("shared_roots", []):
        argv += ["--shared-root", root]
    if config.get("task_uids"):
        if os.geteuid() == 0:
            argv += ["--task-uids", config["task_uids"]]
        else:
            log.warning("the fleet runs tasks under uids %s, which needs the agent to run as root: tasks run as "
                        "this agent's user", config["task_uids"])  # fmt: skip
    return argv


# --- the command -----------------------------------------------------------------------------------------------------
def _host_name(value: str) -> str:
    if not is_host_name(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a host name ({HOST_NAME_RULE})")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tfdash-agent", description="The tfdash agent of one training host.")
    top.add_argument("--version", action="version", version=f"tfdash-agent {__version__}")
    commands = top.add_subparsers(dest="command", required=True)
    config_help = f"the configuration file (default {CONFIG_ROOT} as root, else {CONFIG_USER})"
    one = commands.add_parser(
        "join", help="ask the control plane for this host's configuration and write it once", allow_abbrev=False
    )
    one.add_argument("url", help="the control plane's address, e.g. https://tfdash.lab.example")
    one.add_argument("--host", required=True, type=_host_name, help="this host's name as registered")
    one.add_argument("--token-file", required=True, type=Path, help="this host's agent token (a file, mode 0600)")
    one.add_argument("--control-key", default="", help="the control plane's public key, as the admin page shows it")
    one.add_argument("--config", type=Path, default=None, help=config_help)
    one.add_argument("--workdir", type=Path, default=None, help="scripts and task folders (default: as the agent's)")
    one.add_argument("--force", action="store_true", help="replace a configuration written before")
    run = commands.add_parser("run", help="start the agent from the configuration join wrote", allow_abbrev=False)
    run.add_argument("--config", type=Path, default=None, help=config_help)
    run.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s tfdash-agent: %(message)s")
    config_path = (args.config or default_config()).expanduser()
    try:
        if args.command == "join":
            written = join(
                args.url, args.host, args.token_file, config_path,
                control_key=args.control_key, workdir=args.workdir, force=args.force,
            )  # fmt: skip
            print(f"joined {written['url']} as {written['host']}; wrote {config_path}; start it with: tfdash-agent run"
                  + ("" if config_path == default_config() else f" --config {config_path}"))  # fmt: skip
            return 0
        config = read_config(config_path)
    except Failed as exc:
        print(f"tfdash-agent: {exc}", file=sys.stderr)
        return 2
    logging.getLogger().handlers.clear()  # the agent sets its own format
    return cli.main(agent_argv(config, args.log_level))


if __name__ == "__main__":
    sys.exit(main())
