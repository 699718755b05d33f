"""A task's own TensorBoard folder: given to it, packed as one artifact when it ends, nothing outside it taken."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile

import pytest

from contracts.protocol import TASK_ARTIFACT, TASK_EVENT
from contracts.task_messages import TaskEventKind
from tests.worker_agent.supervision.specs import spec_for
from worker_agent.supervision import tensorboard_dir


def members(content: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(content), mode="r:gz") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}


def test_a_tasks_summaries_arrive_as_one_artifact_before_its_exit(supervisor, sent, tmp_path):
    secret = tmp_path / "secret" / "agent.token"
    secret.parent.mkdir()
    secret.write_text("the agent's token")
    spec = spec_for("summaries.py", str(secret), task_type="chief", task_index=0)

    supervisor.launch(spec)
    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert exited["exit_code"] == 0
    names = [name for name, _ in sent.of(spec.task_id)]
    artifacts = [body for name, body in sent.of(spec.task_id) if name == TASK_ARTIFACT]
    assert len(artifacts) == 1 and names.index(TASK_ARTIFACT) < len(names) - 1
    assert names[-1] == TASK_EVENT
    artifact = artifacts[0]
    content = base64.b64decode(artifact["content_b64"])
    assert artifact["name"] == "tensorboard-chief-0.tar.gz"
    assert artifact["sha256"] == hashlib.sha256(content).hexdigest()
    # The layout kept; the symlinks (to a file and to a folder outside) not followed.
    assert members(content) == {
        "train/events.out.tfevents.1.host.1.v2": b"train-events",
        "validation/deep/events.out.tfevents.2.host.1.v2": b"validation-events",
    }
    printed = sent.texts(spec.task_id)[0]
    assert printed.endswith("/tensorboard/chief-0") and printed.startswith(str(tmp_path))


def test_a_task_that_wrote_no_summaries_sends_no_artifact(supervisor, sent):
    spec = spec_for("chatty.py", "0")

    supervisor.launch(spec)
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert TASK_ARTIFACT not in [name for name, _ in sent.of(spec.task_id)]


def test_files_of_another_owner_and_summaries_over_the_limit_are_left_out(tmp_path):
    root = tmp_path / "tb"
    (root / "run").mkdir(parents=True)
    (root / "run" / "mine").write_bytes(b"m")
    theirs = root / "run" / "theirs"
    theirs.write_bytes(b"t")
    me = os.getuid()
    if me == 0:
        os.chown(theirs, 12345, 12345)
        assert members(tensorboard_dir.pack(root, owner=me)) == {"run/mine": b"m"}
    (root / "run" / "big").write_bytes(os.urandom(200_000))  # does not compress

    assert tensorboard_dir.pack(root, owner=None, limit=100_000) is None
    assert tensorboard_dir.pack(tmp_path / "missing", owner=None) is None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the folder to a task uid")
def test_with_task_uids_the_folder_is_the_jobs_own_and_named_in_the_tasks_environment(tmp_path):
    from worker_agent.supervision import identity, programs
    from worker_agent.supervision.workspace import Workspace

    workdir = tmp_path / "agent"
    workdir.mkdir()
    workspace = Workspace(workdir, [], identity.parse_range("30500-30509"))
    spec = spec_for("chatty.py")
    prepared = workspace.prepare(spec, programs.load(spec.program))
    try:
        folder = prepared.tensorboard
        assert folder == tensorboard_dir.folder(folder.parent.parent, spec)
        assert prepared.env["TFDASH_TENSORBOARD_DIR"] == str(folder)
        assert folder.stat().st_uid == prepared.uid and folder.parent.stat().st_uid == prepared.uid
    finally:
        workspace.leave(spec.job_id, prepared.uid)
