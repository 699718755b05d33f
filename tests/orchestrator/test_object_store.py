"""The object store against a real moto server process (behind its SigV4 gate, tests/support/object_store.py): what a
task's presigned URLs reach, the checkpoint slots and manifest, and what a restore accepts."""

from __future__ import annotations

import http.client
import io
import os
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest

from contracts import store as keys
from contracts.store import Manifest, StoreUrls, store_urls_from
from orchestrator.objectstore import store as storage
from worker_agent.folders import Place
from worker_agent.supervision import checkpoint_restore
from worker_agent.supervision.checkpoint_upload import CheckpointUploader
from worker_agent.supervision.store_http import StoreError, http_put


def fake_task(store: Any, job_id: int, task_id: int, *, index: int = 0, attempt: int = 1) -> Any:
    cluster = SimpleNamespace(store_bucket=store.bucket)
    job = SimpleNamespace(cluster=cluster)
    return SimpleNamespace(job=job, job_id=job_id, pk=task_id, attempt=attempt, type="worker", index=index)


def urls_for(store: Any, job_id: int, task_id: int = 1, index: int = 0) -> StoreUrls:
    raw = storage.task_urls(store.client(), fake_task(store, job_id, task_id, index=index), has_chief=False)
    urls = store_urls_from(raw)
    assert urls is not None
    return urls


def request(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    try:
        headers = {"Content-Type": "application/octet-stream"}
        with urllib.request.urlopen(urllib.request.Request(url, body, headers, method=method), timeout=30) as r:  # noqa: S310
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def on_key(url: str, old: str, new: str) -> str:
    """The same signed URL pointed at another key: the path changed, the query (signature) kept."""
    assert f"/{old}?" in url
    return url.replace(f"/{old}?", f"/{new}?")


def checkpoint_folder(root: Path, epoch: int, payload: bytes) -> Place:
    """A job folder whose checkpoints/chief/ looks like tf_keras BackupAndRestore's after `epoch` saves."""
    chief = root / "checkpoints" / "chief"
    chief.mkdir(parents=True, exist_ok=True)
    for old in chief.glob("ckpt-*"):
        if old.is_file():
            old.unlink()
    (chief / f"ckpt-{epoch}.data-00000-of-00001").write_bytes(payload)
    (chief / f"ckpt-{epoch}.index").write_bytes(b"index %d" % epoch)
    (chief / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{epoch}"\n')
    (root / "checkpoints" / "workertemp_1").mkdir(exist_ok=True)
    return Place(Path("/"), root.resolve().parts[1:])


def test_it_reads_the_credentials_file_as_ini_or_key_value_lines(tmp_path):
    ini = tmp_path / "ini"
    ini.write_text("[default]\naws_access_key_id = AKIA1\naws_secret_access_key = s3cr3t\n")
    plain = tmp_path / "plain"
    plain.write_text("access_key_id=AKIA2\nsecret_access_key=other\n")
    named = tmp_path / "named"
    named.write_text("[tfdash]\naws_access_key_id = AKIA3\naws_secret_access_key = third\n")
    empty = tmp_path / "empty"
    empty.write_text("region=eu\n")

    assert storage.read_credentials(str(ini)) == ("AKIA1", "s3cr3t")
    assert storage.read_credentials(str(plain)) == ("AKIA2", "other")
    assert storage.read_credentials(str(named)) == ("AKIA3", "third")
    with pytest.raises(storage.StoreUnavailable, match="names no access key id") as refused:
        storage.read_credentials(str(empty))
    assert "s3cr3t" not in str(refused.value)
    with pytest.raises(storage.StoreUnavailable, match="cannot read"):
        storage.read_credentials(str(tmp_path / "missing"))


def test_only_the_authoritative_task_gets_put_urls_for_the_checkpoint(object_store):
    chief = urls_for(object_store, 7, task_id=70, index=0)
    other = urls_for(object_store, 7, task_id=71, index=1)

    assert chief.uploads_checkpoints and not other.uploads_checkpoints
    assert set(other.slot_get) == {"a", "b"} and other.manifest_get
    assert len(other.artifact_put) == keys.ARTIFACT_SLOTS
    assert all("/jobs/7/artifacts/71-1-" in urlsplit(u).path for u in other.artifact_put)
    assert keys.shown(chief.manifest_put).endswith("/tfdash-test/jobs/7/checkpoints/manifest.json")
    assert "X-Amz-Signature" not in keys.shown(chief.manifest_put)


def test_a_hosts_urls_for_job_a_cannot_read_or_write_job_b(object_store):
    s3 = object_store.client()
    s3.put_object(Bucket=object_store.bucket, Key="jobs/2/checkpoints/manifest.json", Body=b"job B's")
    a = urls_for(object_store, 1)
    a_manifest, b_manifest = keys.manifest_key(1), keys.manifest_key(2)

    # Its own keys work, for the method signed.
    assert request("PUT", a.manifest_put, b"{}")[0] == 200
    assert request("GET", a.manifest_get) == (200, b"{}")
    # The same URLs on job B's keys: refused by the signature, nothing read, nothing written.
    status, body = request("GET", on_key(a.manifest_get, a_manifest, b_manifest))
    assert (status, b"SignatureDoesNotMatch" in body) == (403, True)
    status, body = request("PUT", on_key(a.manifest_put, a_manifest, b_manifest), b"overwritten")
    assert (status, b"SignatureDoesNotMatch" in body) == (403, True)
    artifact = a.artifact_put[0]
    own = urlsplit(artifact).path.split("/", 2)[2]
    status, _ = request("PUT", on_key(artifact, own, "jobs/2/artifacts/1-1-0"), b"x")
    assert status == 403
    # A GET URL does not PUT, and no URL at all is anonymous.
    assert request("PUT", a.manifest_get, b"{}")[0] == 403
    assert request("GET", f"{object_store.endpoint}/{object_store.bucket}/{b_manifest}")[0] == 403
    stored = s3.get_object(Bucket=object_store.bucket, Key=b_manifest)["Body"].read()
    assert stored == b"job B's"


def test_a_checkpoint_round_trips_through_the_alternating_slots(object_store, tmp_path):
    urls = urls_for(object_store, 3)
    source = checkpoint_folder(tmp_path / "host1", 1, b"one" * 1000)
    uploader = CheckpointUploader(urls, source, None, tmp_path / "scratch", "t", named=None)

    (tmp_path / "host1" / "checkpoints" / "chief" / "ckpt-2_temp").mkdir()  # a save under way: not named yet
    assert uploader.poll() is True
    assert uploader.poll() is False  # nothing new
    first = checkpoint_restore.read_manifest(urls)
    checkpoint_folder(tmp_path / "host1", 2, b"two" * 1000)
    assert uploader.poll() is True
    second = checkpoint_restore.read_manifest(urls)

    assert first is not None and second is not None
    assert (first.slot, first.epoch, second.slot, second.epoch) == ("a", 1, "b", 2)
    target = Place(Path("/"), (tmp_path / "host2").resolve().parts[1:])
    restored = checkpoint_restore.restore(urls, target, None, tmp_path / "scratch2")
    assert restored == second
    chief = tmp_path / "host2" / "checkpoints" / "chief"
    # What the index names only: not the save that was under way (ckpt-2_temp/ then), nor older leftovers.
    assert sorted(p.name for p in chief.iterdir()) == ["checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"]
    assert (chief / "ckpt-2.data-00000-of-00001").read_bytes() == b"two" * 1000
    assert not (tmp_path / "host2" / "checkpoints" / "workertemp_1").exists()  # another worker's scratch: not sent


def test_a_half_written_checkpoint_is_never_restored(object_store, tmp_path):
    urls = urls_for(object_store, 4)
    source = checkpoint_folder(tmp_path / "host1", 1, b"good" * 1000)
    uploader = CheckpointUploader(urls, source, None, tmp_path / "scratch", "t", named=None)
    assert uploader.poll() is True  # epoch 1 complete: slot a, named by the manifest

    # The next upload is killed mid-way: the PUT of slot b ends after half its declared length.
    parts = urlsplit(urls.slot_put["b"])
    conn = http.client.HTTPConnection(parts.netloc, timeout=10)
    conn.putrequest("PUT", f"{parts.path}?{parts.query}")
    conn.putheader("Content-Length", "100000")
    conn.endheaders()
    conn.send(b"x" * 50_000)
    conn.close()
    # And a complete tar in slot b whose manifest was never written (the agent died between the two PUTs).
    http_put(urls.slot_put["b"], b"not the checkpoint", 18)

    target = Place(Path("/"), (tmp_path / "host2").resolve().parts[1:])
    restored = checkpoint_restore.restore(urls, target, None, tmp_path / "scratch2")
    assert restored is not None and (restored.slot, restored.epoch) == ("a", 1)
    data = tmp_path / "host2" / "checkpoints" / "chief" / "ckpt-1.data-00000-of-00001"
    assert data.read_bytes() == b"good" * 1000

    # A manifest naming a slot whose bytes are not the ones it describes: refused, the folder left as it was.
    bogus = Manifest("b", "0" * 64, 18, 2, 0.0).to_bytes()
    http_put(urls.manifest_put, bogus, len(bogus))
    with pytest.raises(StoreError, match="does not match its manifest"):
        checkpoint_restore.restore(urls, target, None, tmp_path / "scratch3")
    assert data.read_bytes() == b"good" * 1000


def test_a_no_manifest_store_leaves_the_folder_alone(object_store, tmp_path):
    urls = urls_for(object_store, 5)
    (tmp_path / "job" / "checkpoints").mkdir(parents=True)
    (tmp_path / "job" / "checkpoints" / "mine").write_text("local")
    target = Place(Path("/"), (tmp_path / "job").resolve().parts[1:])

    assert checkpoint_restore.restore(urls, target, None, tmp_path / "scratch") is None
    assert (tmp_path / "job" / "checkpoints" / "mine").read_text() == "local"


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return out.getvalue()


@pytest.mark.parametrize(
    ("name", "kind"),
    [("../escape", tarfile.REGTYPE), ("/etc/evil", tarfile.REGTYPE), ("link", tarfile.SYMTYPE),
     ("hard", tarfile.LNKTYPE), ("fifo", tarfile.FIFOTYPE), ("dev", tarfile.CHRTYPE)],
)  # fmt: skip
def test_a_checkpoint_tar_with_anything_but_plain_files_and_folders_is_refused(tmp_path, name, kind):
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = "/etc/passwd"
    data = b"x" if kind == tarfile.REGTYPE else b""
    member.size = len(data)
    archive = tmp_path / "c.tar"
    archive.write_bytes(_tar_with(member, data))
    into = tmp_path / "into"
    into.mkdir()
    fd = os.open(into, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(StoreError):
            checkpoint_restore.extract_plain(archive, fd)
    finally:
        os.close(fd)
    assert list(into.iterdir()) == []
    assert not (tmp_path / "escape").exists()


def test_a_link_in_the_checkpoint_folder_is_never_followed_into_the_upload(object_store, tmp_path):
    urls = urls_for(object_store, 6)
    source = checkpoint_folder(tmp_path / "host1", 1, b"mine")
    secret = tmp_path / "agent-secret"
    secret.write_text("the agent's token")
    chief = tmp_path / "host1" / "checkpoints" / "chief"
    (chief / "ckpt-1.data-00000-of-00001").unlink()
    (chief / "ckpt-1.data-00000-of-00001").symlink_to(secret)  # named by the index, but a link
    uploader = CheckpointUploader(urls, source, None, tmp_path / "scratch", "t", named=None)

    assert uploader.poll() is True
    target = Place(Path("/"), (tmp_path / "host2").resolve().parts[1:])
    checkpoint_restore.restore(urls, target, None, tmp_path / "scratch2")

    restored = tmp_path / "host2" / "checkpoints" / "chief"
    assert sorted(p.name for p in restored.iterdir()) == ["checkpoint", "ckpt-1.index"]
    assert not any("the agent's token" in p.read_text() for p in restored.iterdir())
