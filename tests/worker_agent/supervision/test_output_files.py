"""Task output written to files first: an agent that dies under a running task loses none of its lines, the task
never sees a broken pipe, and the next agent carries on from the persisted position (no line twice)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from contracts import broker
from tests.support.processes import gone, wait_until
from tests.worker_agent.recording import Recorder
from tests.worker_agent.supervision.specs import spec_for
from worker_agent.supervision import Supervisor
from worker_agent.supervision.output import OutputFiles, Position, TaskLogs

LINES = 3000


class DyingRecorder(Recorder):
    """The dead agent's outbox: once `dead`, nothing more is published (and no position persisted)."""

    dead = False

    def __call__(
        self, name: str, body: dict[str, Any], queue: str = broker.EVENTS, then: Callable[[], None] | None = None
    ) -> None:
        if not self.dead:
            super().__call__(name, body, queue, then)


def test_a_task_outlives_its_agent_and_the_next_one_sends_every_line_once(tmp_path, shared):
    dying = DyingRecorder()
    agent = Supervisor(dying, tmp_path / "agent", shared_roots=[shared])
    spec = spec_for("outlives_agent.py", "--lines", str(LINES), "--folder", str(shared))
    agent.launch(spec)
    wait_until((shared / "half").exists, timeout=30, what="the first half printed")
    wait_until(lambda: len(dying.lines(spec.task_id)) >= LINES // 2, timeout=30, what="the first half sent")
    dying.dead = True  # the agent is gone: from here on nothing it reads is published
    (shared / "go").touch()
    pid = int(wait_until(lambda: (shared / "done").exists() and (shared / "done").read_text(), timeout=30))
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # printing on with no agent did not end it

    successor_sent = Recorder()
    successor = Supervisor(successor_sent, tmp_path / "agent", shared_roots=[shared])
    (_reclaimed,) = successor.reclaim()
    assert gone(pid)

    before = [seq for seq, _, _ in dying.lines(spec.task_id)]
    after = successor_sent.lines(spec.task_id)
    seqs = Counter(before + [seq for seq, _, _ in after])
    assert sorted(seqs) == list(range(LINES)) and set(seqs.values()) == {1}  # every line, each once
    # Every printed line is there once (stdout and stderr are two files: their order across the two is not kept).
    texts = Counter(text for _, _, text in dying.lines(spec.task_id) + after)
    assert texts == Counter(f"line {i}" for i in range(LINES))
    assert {stream for _, stream, _ in after} == {"stdout", "stderr"}
    (lost,) = successor.report().exits
    assert (lost.task_id, lost.lost, lost.lines) == (spec.task_id, True, LINES)
    assert OutputFiles(tmp_path / "agent").leftovers() == []  # all published: the files are gone
    agent.kill_all("test over", timeout=10)


def test_the_position_is_persisted_once_a_batch_is_published_and_the_rest_read_again(tmp_path):
    files = OutputFiles(tmp_path)
    fds = files.create(5, 1)
    try:
        Path(f"/proc/self/fd/{fds['stdout']}").write_text("")  # opened append-only: writes go to the end
        for i in range(10):
            os.write(fds["stdout"], f"line {i}\n".encode())
        os.write(fds["stderr"], b"no newline at the end")
    finally:
        for fd in fds.values():
            os.close(fd)
    unpublished: list[Callable[[], None]] = []

    def send(name: str, body: dict[str, Any], queue: str = broker.EVENTS, then: Any = None) -> None:
        unpublished.append(then)

    logs = TaskLogs(5, 1, send, files)
    logs.open()
    logs.read_available(final=False)
    logs.flush()
    assert logs.lines == 10  # the partial line waits for its end (or for the task's)
    assert files.load_position(5, 1) == Position()  # nothing published yet
    unpublished[0]()
    assert files.load_position(5, 1) == Position(
        stdout=len(b"".join(f"line {i}\n".encode() for i in range(10))), seq=10
    )

    recorder = Recorder()
    assert TaskLogs(5, 1, recorder, files).drain() == 11
    assert recorder.lines(5) == [(10, "stderr", "no newline at the end")]
    assert files.leftovers() == []


def test_the_output_files_are_the_agents_and_out_of_the_tasks_reach_by_name(tmp_path):
    files = OutputFiles(tmp_path)
    fds = files.create(6, 1)
    for fd in fds.values():
        os.close(fd)
    folder = os.stat(files.folder)
    assert (folder.st_mode & 0o777, folder.st_uid) == (0o700, os.geteuid())  # a task's uid cannot even look in
    for stream in ("stdout", "stderr"):
        info = os.lstat(files.path(6, 1, stream))
        assert (info.st_mode & 0o777, info.st_uid) == (0o600, os.geteuid())
    # A link swapped in for a file is never followed when the agent opens it again (after a restart).
    files.path(6, 1, "stdout").unlink()
    files.path(6, 1, "stdout").symlink_to("/etc/hostname")
    recorder = Recorder()
    assert TaskLogs(6, 1, recorder, files).drain() == 0
    assert recorder.lines(6) == []
