"""The client's artifact and TensorBoard calls: list and download a job's artifacts (checked against their SHA-256,
from the object store when the server redirects there), and a job's metrics written as a TensorBoard logdir."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import httpx

from tfdash.api_transport import Transport
from tfdash.errors import Unreachable


class ArtifactsApi(Transport):
    # --- artifacts ------------------------------------------------------------------------------------------------
    def artifacts(self, job_id: int) -> list[dict[str, Any]]:
        return list(self._request("GET", f"/api/jobs/{int(job_id)}/artifacts/"))

    def download_artifact(self, job_id: int, name: str, folder: str | Path = ".") -> Path:
        """Save one artifact as `folder/job<id>-<name>`, checked against the SHA-256 the server sent."""
        response = self._send("GET", f"/api/jobs/{int(job_id)}/artifacts/{name}/", accept="*/*")
        target = Path(folder) / f"job{int(job_id)}-{Path(name).name}"
        expected = response.headers.get("X-Content-SHA256")
        location = response.headers.get("Location")
        if response.status_code in (302, 303, 307) and location:
            # In the cluster's object store: fetched from the presigned URL, without this client's token.
            self._fetch_to(location, target, expected, name)
            return target
        if expected and hashlib.sha256(response.content).hexdigest() != expected:
            raise Unreachable(f"{name} arrived damaged (its SHA-256 does not match); try again.")
        target.write_bytes(response.content)
        return target

    def _fetch_to(self, url: str, target: Path, expected: str | None, name: str) -> None:
        """Stream `url` (a presigned object-store URL) into `target`, checked against `expected` before it is named
        so; the URL is never shown (it carries a signature)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        fd, scratch = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out, httpx.stream("GET", url, timeout=self._http.timeout) as r:
                if r.status_code >= 400:
                    raise Unreachable(f"The object store answered {r.status_code} for {name}; try again.")
                for chunk in r.iter_bytes():
                    digest.update(chunk)
                    out.write(chunk)
            if expected and digest.hexdigest() != expected:
                raise Unreachable(f"{name} arrived damaged (its SHA-256 does not match); try again.")
            os.replace(scratch, target)
        except httpx.HTTPError:
            raise Unreachable(f"Cannot fetch {name} from the object store; try again.") from None
        finally:
            if os.path.exists(scratch):
                os.unlink(scratch)

    def tensorboard(self, job_id: int, folder: str | Path = ".") -> Path:
        """Write the job's stored metrics as a TensorBoard logdir, `folder/job<id>` (`GET /api/jobs/<id>/tensorboard/`:
        one run per task and phase, one scalar tag per metric), and return it. The archive is streamed to a temporary
        file and unpacked keeping only plain files and folders under the logdir (no absolute path, `..` or link). A
        logdir left by an earlier export of the same job (event files only) is replaced; anything else there raises
        FileExistsError, before anything is fetched."""
        target = Path(folder) / f"job{int(job_id)}"
        _replaceable_logdir(target)
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".job{int(job_id)}-", dir=folder) as scratch:
            archive = Path(scratch) / "tensorboard.tar.gz"
            try:
                with self._http.stream("GET", f"/api/jobs/{int(job_id)}/tensorboard/", headers={"Accept": "*/*"}) as r:
                    if r.status_code >= 400:
                        r.read()
                        self._raise_for(r, "GET", f"/api/jobs/{int(job_id)}/tensorboard/")
                    with archive.open("wb") as out:
                        for chunk in r.iter_bytes():
                            out.write(chunk)
            except httpx.HTTPError as exc:
                raise Unreachable(f"Cannot fetch job {job_id}'s TensorBoard export from {self.url}: {exc}.") from None
            unpacked = Path(scratch) / "unpacked"
            try:
                with tarfile.open(archive, "r:gz") as tar:
                    _extract_plain(tar, unpacked)
            except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
                raise Unreachable(f"Job {job_id}'s TensorBoard export arrived damaged ({exc}); try again.") from None
            made = unpacked / target.name
            if not made.is_dir():
                made.mkdir(parents=True)  # a job with no points: an empty archive, an empty logdir
            if target.exists():
                shutil.rmtree(target)
            made.rename(target)
        return target


def _replaceable_logdir(target: Path) -> None:
    """Refuse to write over anything but an earlier export: a folder of TensorBoard event files only."""
    if not target.exists() and not target.is_symlink():
        return
    if target.is_symlink() or not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a TensorBoard export; remove it or choose another --to.")
    for path in target.rglob("*"):
        if path.is_symlink() or (not path.is_dir() and not path.name.startswith("events.out.tfevents.")):
            raise FileExistsError(
                f"{target} holds {path.relative_to(target)}, which no export wrote; remove it or choose another --to."
            )


def _extract_plain(tar: tarfile.TarFile, into: Path) -> None:
    """Unpack only regular files and folders with relative names and no `..`; anything else is a damaged export.
    (tarfile's `data` filter does this too, but a Python 3.11 before 3.11.4, such as Debian 12's, lacks it.)"""
    members = tar.getmembers()
    for member in members:
        parts = Path(member.name).parts
        if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in parts:
            raise ValueError(f"unexpected member {member.name!r}")
    safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    for member in members:
        tar.extract(member, into, set_attrs=False, **safe)
