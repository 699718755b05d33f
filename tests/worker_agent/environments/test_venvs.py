"""The requirements venvs' cache: keyed by the base interpreter and the requirement lines (comments aside), bounded by
evicting the least recently used ready venvs that no process runs from, never the one just used."""

from __future__ import annotations

import os
from pathlib import Path

from worker_agent.environments import venvs
from worker_agent.environments.as_task import Helper


def ready(root: Path, name: str, size: int, used_at: int) -> Path:
    folder = root / venvs.FOLDER / name
    folder.mkdir(parents=True)
    (folder / "blob").write_bytes(b"x" * size)
    (folder / venvs.READY).touch()
    os.utime(folder / venvs.READY, (used_at, used_at))
    return folder


def test_the_key_is_the_base_and_the_requirement_lines() -> None:
    assert venvs.key("/opt/a/bin/python", "tabulate\n") == venvs.key("/opt/a/bin/python", "# pinned\ntabulate  # x\n")
    assert venvs.key("/opt/a/bin/python", "tabulate\n") != venvs.key("/opt/b/bin/python", "tabulate\n")
    assert venvs.key("/opt/a/bin/python", "tabulate\n") != venvs.key("/opt/a/bin/python", "tabulate==0.9\n")


def test_over_its_bound_the_least_recently_used_go_first_and_the_one_in_use_stays(tmp_path: Path) -> None:
    cache = venvs.Venvs(tmp_path, Helper(None), cache_mb=1)
    oldest = ready(tmp_path, "a" * 64, 400_000, 1_000)
    middle = ready(tmp_path, "b" * 64, 400_000, 2_000)
    newer = ready(tmp_path, "c" * 64, 400_000, 3_000)
    cache._evict(keep="a" * 64)  # just used: stays although it is the oldest
    assert oldest.exists() and not middle.exists() and newer.exists()  # 1.2 MB -> 0.8 MB, within 1 MiB
    newest = ready(tmp_path, "d" * 64, 400_000, 4_000)
    cache._evict(keep="d" * 64)
    assert oldest.exists() is False and newer.exists() and newest.exists()
