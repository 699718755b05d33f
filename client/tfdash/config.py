"""Where `tfdash login` keeps the server's URL and the API token: `config.json` in the user's config folder
(`$TFDASH_CONFIG_DIR`, else `$XDG_CONFIG_HOME/tfdash`, else `~/.config/tfdash`; `%APPDATA%\\tfdash` on Windows),
readable by its owner only (folder 0700, file 0600). `TFDASH_URL` and `TFDASH_TOKEN` override what is stored (CI)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "config.json"


@dataclass(frozen=True)
class Stored:
    url: str = ""
    token: str = ""
    username: str = ""


def folder() -> Path:
    if os.environ.get("TFDASH_CONFIG_DIR"):
        return Path(os.environ["TFDASH_CONFIG_DIR"])
    if sys.platform == "win32" and os.environ.get("APPDATA"):
        return Path(os.environ["APPDATA"]) / "tfdash"
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tfdash"


def path() -> Path:
    return folder() / FILE_NAME


def load(*, environment: bool = True) -> Stored:
    """What is stored, with the environment's overrides (unless `environment` is False: what `tfdash login` wrote
    alone); an empty Stored when nothing is (or it is unreadable)."""
    try:
        data = json.loads(path().read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    env = os.environ if environment else {}
    return Stored(
        url=env.get("TFDASH_URL") or str(data.get("url") or ""),
        token=env.get("TFDASH_TOKEN") or str(data.get("token") or ""),
        username=str(data.get("username") or ""),
    )


def save(stored: Stored) -> Path:
    """Write the file readable by its owner only: created 0600 (never briefly wider), folder 0700."""
    target = path()
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = target.with_name(f".{FILE_NAME}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as file:
            json.dump({"url": stored.url, "token": stored.token, "username": stored.username}, file)
        os.chmod(temporary, 0o600)  # an umask cannot widen it, but a file left over from before could be wider
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target


def forget() -> bool:
    """Remove the stored token; True when there was one."""
    try:
        path().unlink()
    except FileNotFoundError:
        return False
    return True
