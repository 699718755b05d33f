"""The folders the agent acts on: paths kept under its roots, and walks that a link swapped in mid-walk cannot turn
onto a file outside (the stand-in for /etc is a temporary folder whose files have an owner of their own)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from worker_agent import folders
from worker_agent.folders import Outside, Place, Roots
from worker_agent.supervision import uid_pool
from worker_agent.supervision.identity import UidRange
from worker_agent.supervision.uid_pool import TaskUids

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root (CI runs as root)")

OUTSIDERS_UID = 4242  # owns the files of the stand-in for /etc
TASK_UID = 30400  # the tests' uids: tests/support/task_uids.py


# --- paths under the roots ------------------------------------------------------------------------------------------
def test_a_path_is_placed_under_the_longest_root_that_holds_it(tmp_path):
    roots = Roots.agent(tmp_path / "agent", [tmp_path])

    assert roots.place(str(tmp_path / "agent" / "jobs" / "3")) == Place(tmp_path / "agent", ("jobs", "3"))
    assert roots.place(f"{tmp_path}//jobs/./4/") == Place(tmp_path, ("jobs", "4"))


def test_a_root_reached_through_a_link_may_be_named_either_way(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "mounted").symlink_to(tmp_path / "real")
    roots = Roots.agent(tmp_path / "agent", [tmp_path / "mounted"])

    assert roots.place(str(tmp_path / "real" / "jobs" / "5")) == Place(tmp_path / "mounted", ("jobs", "5"))


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/cron.d", "is not under"),
        ("{root}/../etc", "contains '..'"),
        ("jobs/5", "not an absolute path"),
        ("{root}/jobs/\0", "without NUL"),
        ("", "non-empty"),
        (5, "must be a string"),
    ],
)
def test_anything_else_is_refused_with_the_reason(tmp_path, path, why):
    roots = Roots.agent(tmp_path)

    with pytest.raises(Outside, match=why):
        roots.place(path.format(root=tmp_path) if isinstance(path, str) else path)


def test_a_link_below_a_root_is_never_followed(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "jobs").symlink_to(tmp_path / "etc")

    with pytest.raises(folders.NotAFolder, match="is not a folder"):
        folders.open_folder(Place(tmp_path / "root", ("jobs", "5")), create=True)
    assert list((tmp_path / "etc").iterdir()) == []


# --- a link swapped in mid-walk --------------------------------------------------------------------------------------
@pytest.fixture
def etc(tmp_path: Path) -> Path:
    """The stand-in for /etc: a folder and a file owned by someone else."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "shadow").write_text("secrets")
    (etc / "ckpt-1").write_text("named like a file of the job's")
    if os.geteuid() == 0:
        for path in (etc, etc / "shadow", etc / "ckpt-1"):
            os.chown(path, OUTSIDERS_UID, OUTSIDERS_UID)
    return etc


def job_folder(tmp_path: Path) -> Place:
    """A job's folder holding a folder and a file, as a task leaves it."""
    folder = tmp_path / "agent" / "jobs" / "3"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt-1").write_text("weights")
    (folder / "model.keras").write_text("weights")
    return Place(tmp_path / "agent", ("jobs", "3"))


def swap_for_links(folder: Path, etc: Path) -> None:
    """What a task racing the walk does: its folder and its file become links to the outside."""
    os.rename(folder / "checkpoints", folder / "checkpoints.old")
    (folder / "checkpoints").symlink_to(etc)
    os.rename(folder / "model.keras", folder / "model.keras.old")
    (folder / "model.keras").symlink_to(etc / "shadow")


def own(place: Place) -> None:
    """A job's uid gets its folder (a restarted job whose folder root owns now)."""
    uid_pool.own_folder(place, TASK_UID)


def hand_back(place: Place) -> None:
    """Job 3's uid goes to job 23: job 3's folder (its uid's) goes back to root first."""
    pool = TaskUids(UidRange(TASK_UID, TASK_UID), Roots.agent(place.root))
    pool.acquire(23, [place.parent().child("23")])
    pool.release(TASK_UID)


@needs_root
@pytest.mark.parametrize("walk", ["own", "hand back"])
@pytest.mark.parametrize("moment", ["after the listing", "after the stat"])
def test_a_link_swapped_in_mid_walk_chowns_nothing_outside(tmp_path, etc, monkeypatch, walk, moment):
    place = job_folder(tmp_path)
    if walk == "hand back":
        own(place)  # what job 3 left: all its uid's
        # Handing back moves only what task uids own: the outside looks like a task uid's too.
        for path in (etc, etc / "shadow", etc / "ckpt-1"):
            os.chown(path, TASK_UID, OUTSIDERS_UID)
    outside = [etc, etc / "shadow", etc / "ckpt-1"]
    before = {path: (path.stat().st_uid, path.stat().st_gid) for path in outside}
    swapped: list[str] = []

    def swap_once() -> None:
        if not swapped:
            swapped.append(moment)
            swap_for_links(place.path, etc)

    if moment == "after the listing":
        real_entries: Callable[[int], list[str]] = folders.entries

        def entries(fd: int) -> list[str]:
            names = real_entries(fd)
            if "model.keras" in names:
                swap_once()
            return names

        monkeypatch.setattr(folders, "entries", entries)
    else:
        real_lstat = folders._lstat_at

        def lstat_at(fd: int, name: str) -> os.stat_result:
            info = real_lstat(fd, name)
            if name == "model.keras":
                swap_once()
            return info

        monkeypatch.setattr(folders, "_lstat_at", lstat_at)

    (own if walk == "own" else hand_back)(place)

    assert swapped == [moment]
    assert {path: (path.stat().st_uid, path.stat().st_gid) for path in outside} == before
    assert (etc / "shadow").read_text() == "secrets"
    # The job's folder itself was walked: it moved (to the task, or back to root).
    assert place.path.stat().st_uid == (TASK_UID if walk == "own" else 0)


@needs_root
def test_a_file_a_task_hard_linked_in_keeps_its_owner(tmp_path, etc):
    place = job_folder(tmp_path)
    os.link(etc / "shadow", place.path / "innocent")  # what a task could plant where protected_hardlinks is off

    uid_pool.own_folder(place, TASK_UID)

    assert (place.path / "model.keras").stat().st_uid == TASK_UID
    assert (etc / "shadow").stat().st_uid == OUTSIDERS_UID


# --- files ------------------------------------------------------------------------------------------------------------
def test_a_file_is_read_only_where_it_is_a_plain_file_never_through_a_link(tmp_path, etc):
    place = job_folder(tmp_path)
    (place.path / "linked").symlink_to(etc / "shadow")
    (place.path / "via").symlink_to(etc)

    assert folders.read_file(place.child("model.keras"), owner=None, max_bytes=100) == b"weights"
    assert folders.read_file(place.child("linked"), owner=None, max_bytes=100) == "not a regular file"
    assert "not a folder" in str(folders.read_file(place.child("via", "shadow"), owner=None, max_bytes=100))
    assert folders.read_file(place.child("checkpoints"), owner=None, max_bytes=100) == "not a regular file"
    assert folders.read_file(place.child("model.keras"), owner=None, max_bytes=3) == "7 bytes, more than 3"
    owner = os.stat(place.path / "model.keras").st_uid
    assert folders.read_file(place.child("model.keras"), owner=owner + 1, max_bytes=100) == (
        f"owned by uid {owner}, not by the task's uid {owner + 1}"
    )


def test_a_file_is_written_over_a_planted_link_not_through_it(tmp_path, etc):
    place = job_folder(tmp_path)
    (place.path / "script.py").symlink_to(etc / "shadow")
    fd = folders.open_folder(place)
    try:
        folders.write_file(fd, "script.py", b"print('hi')\n", mode=0o400)
    finally:
        os.close(fd)

    assert (etc / "shadow").read_text() == "secrets"
    assert not (place.path / "script.py").is_symlink()
    assert (place.path / "script.py").read_bytes() == b"print('hi')\n"
    assert oct((place.path / "script.py").stat().st_mode & 0o777) == "0o400"
