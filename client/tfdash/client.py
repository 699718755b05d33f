"""The tfdash REST API from Python: what the `tfdash` command is built on, usable on its own.

    from tfdash.client import Client

    client = Client.from_config()                      # the URL and token `tfdash login` stored
    job = client.submit("train.py", strategy="multi_worker_mirrored", workers=2, env={"DATA": "/shared/d.npz"})
    final = client.wait(job["id"])                     # polls until the job has ended
    for line in client.follow_logs(job["id"]):
        print(line["task"], line["text"])

Every call raises a `TfdashError` subclass on failure, never an HTTP library's own exception: `AuthError` (no or a
refused token), `NotFound` (no such object, or another user's), `Refused` (the server refused the request; `errors`
holds its field -> messages), `Unsupported` (the server has no such API), `Unreachable` (no answer, or a server error).
Only httpx is needed (no Django, no TensorFlow).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypedDict

import httpx

from tfdash import config

TERMINAL_STATES = ("succeeded", "failed", "cancelled", "timed_out")
DEFAULT_TIMEOUT_S = 30.0


class TfdashError(Exception):
    """Something the caller can act on; the message is one line meant for a person."""


class Unreachable(TfdashError):
    """The server did not answer, or answered with an error of its own (5xx)."""


class AuthError(TfdashError):
    """Not signed in, or the token or password was refused (401, 403)."""


class NotFound(TfdashError):
    """No such job, task, experiment or artifact, or it belongs to another user (404)."""


class Unsupported(TfdashError):
    """The server does not offer this API (an older or a different version)."""


class Refused(TfdashError):
    """The server refused the request (400, 409): `errors` is its field -> messages."""

    def __init__(self, message: str, errors: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.errors: dict[str, Any] = dict(errors or {})


class Job(TypedDict, total=False):
    id: int
    name: str
    owner: str
    cluster: int
    cluster_name: str
    strategy: str
    workers: int
    ps: int
    devices_per_worker: int
    env: dict[str, str]
    state: str
    reason: str
    attempt: int
    restarts: int
    failure: dict[str, Any] | None
    created_at: str
    started_at: str | None
    finished_at: str | None


class Task(TypedDict, total=False):
    id: int
    attempt: int
    type: str
    index: int
    host: str | None
    port: int | None
    state: str
    exit_code: int | None


class LogLine(TypedDict):
    task: str  # "worker:0"
    task_id: int
    seq: int
    stream: str  # stdout | stderr
    text: str


def error_text(errors: Mapping[str, Any]) -> str:
    """A 400's field -> messages as one line: `workers: at most 256 workers, not 300; env: TF_CONFIG is reserved`."""
    parts = []
    for field, messages in errors.items():
        text = " ".join(map(str, messages)) if isinstance(messages, list) else str(messages)
        parts.append(text if field in ("non_field_errors", "detail") else f"{field}: {text}")
    return "; ".join(parts)


class Client:
    """One tfdash server, signed in with an API token (`Authorization: Token ...`)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    @classmethod
    def from_config(cls, url: str | None = None) -> Client:
        """The server and token `tfdash login` stored (TFDASH_URL / TFDASH_TOKEN override them); AuthError when
        there are none."""
        stored = config.load()
        url = url or stored.url
        if not url or not stored.token:
            raise AuthError("Not logged in: run `tfdash login URL` first (or set TFDASH_URL and TFDASH_TOKEN).")
        return cls(url, stored.token)

    @staticmethod
    def obtain_token(
        url: str, username: str, password: str, *, name: str = "", timeout: float = DEFAULT_TIMEOUT_S
    ) -> str:
        """Exchange a username and password for a new API token of the user's (`POST /api/token/`), called `name` on
        their API tokens page; it expires after the server's TFDASH_API_TOKEN_DAYS."""
        with Client(url, timeout=timeout) as anonymous:
            try:
                credentials = {"username": username, "password": password, "name": name}
                body = anonymous._request("POST", "/api/token/", json=credentials)
            except Refused:
                raise AuthError("The server refused that username and password.") from None
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise Unreachable(f"{url} answered without a token: is it a tfdash server?")
        return token

    def api_tokens(self) -> list[dict[str, Any]]:
        """Your API tokens (`GET /api/tokens/`): id, name, hint, created_at, expires_at, last_used_at, current."""
        return list(self._request("GET", "/api/tokens/"))

    def revoke_api_token(self, token_id: int) -> None:
        """Revoke one of your API tokens (`DELETE /api/tokens/<id>/`); NotFound when you have none by that id."""
        self._request("DELETE", f"/api/tokens/{int(token_id)}/")

    def revoke_own_token(self) -> None:
        """Revoke the token this client signs in with (`DELETE /api/tokens/current/`, what `tfdash logout` does)."""
        self._request("DELETE", "/api/tokens/current/")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- jobs -----------------------------------------------------------------------------------------------------
    def jobs(self, *, state: str | None = None, limit: int = 100) -> list[Job]:
        """The user's jobs (staff: everyone's), newest first."""
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        body = self._request("GET", "/api/jobs/", params=params)
        return list(body["results"] if isinstance(body, dict) else body)

    def job(self, job_id: int) -> Job:
        result: Job = self._request("GET", f"/api/jobs/{int(job_id)}/")
        return result

    def tasks(self, job_id: int, *, all_attempts: bool = False) -> list[Task]:
        params = {"attempt": "all"} if all_attempts else None
        return list(self._request("GET", f"/api/jobs/{int(job_id)}/tasks/", params=params))

    def submit(
        self,
        script: str | Path | None = None,
        *,
        name: str | None = None,
        args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        builtin: str | None = None,
        config: Mapping[str, Any] | None = None,
        plan: bool = False,
        **fields: Any,
    ) -> dict[str, Any]:
        """Submit a job (or with `plan=True` only validate it and return its placement and TF_CONFIGs).

        `script`: a local .py file to upload, or `builtin`: a built-in program's name. `config`: the hyperparameters
        (`epochs`, `learning_rate`, ...; a script gets them as TFDASH_* variables). `env`: variables every task gets.
        `fields`: the job's other fields (`strategy`, `workers`, `ps`, `devices_per_worker`, `max_restarts`, ...).
        Raises Refused with the server's field -> messages when the job cannot run.
        """
        data: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
        data["args"] = list(args or [])
        data["env"] = dict(env or {})
        data["builtin_config"] = dict(config or {})
        path = "/api/jobs/plan/" if plan else "/api/jobs/"
        if script is None:
            data["builtin"] = builtin or ""
            data.setdefault("name", name or builtin or "job")
            return dict(self._request("POST", path, json=data))
        source = Path(script)
        data["name"] = name or source.stem
        try:
            content = source.read_bytes()
        except OSError as exc:
            raise TfdashError(f"Cannot read {source}: {exc.strerror}.") from None
        # Multipart sends strings: the arguments as one string the API splits like a shell (shlex.join quotes each),
        # objects as JSON text, which the API reads back.
        form = {k: json.dumps(v) if isinstance(v, dict) else _form_value(v) for k, v in data.items()}
        form["args"] = shlex.join(data["args"])
        files = {"script": (source.name, content, "text/x-python")}
        return dict(self._request("POST", path, data=form, files=files))

    def cancel(self, job_id: int) -> Job:
        result: Job = self._request("POST", f"/api/jobs/{int(job_id)}/cancel/")
        return result

    def wait(self, job_id: int, *, poll_s: float = 1.0, on_update: Callable[[Job], None] | None = None) -> Job:
        """Poll the job until it has ended; `on_update` sees every reading. Returns the final job."""
        while True:
            job = self.job(job_id)
            if on_update is not None:
                on_update(job)
            if job.get("state") in TERMINAL_STATES:
                return job
            time.sleep(poll_s)

    def metrics(self, job_id: int, *, since: int = 0, name: str | None = None) -> dict[str, Any]:
        """A page of metric points after the cursor `since`: `columns`, `points`, `next` (pass it back), `more`."""
        params: dict[str, Any] = {"since": since}
        if name:
            params["name"] = name
        return dict(self._request("GET", f"/api/jobs/{int(job_id)}/metrics/", params=params))

    # --- logs -----------------------------------------------------------------------------------------------------
    def log_page(self, job_id: int, task_id: int, *, since: int = -1) -> dict[str, Any]:
        """One task's lines after the cursor `since`: `lines` (seq, stream, text), `next`, `more`."""
        return dict(
            self._request("GET", f"/api/jobs/{int(job_id)}/logs/{int(task_id)}/lines/", params={"since": since})
        )

    def logs(self, job_id: int, *, task: str | None = None) -> Iterator[LogLine]:
        """Every stored line of the job's current tasks (or of `task`, e.g. "worker:0"), task after task."""
        for t in self._select_tasks(job_id, task):
            cursor = -1
            while True:
                page = self.log_page(job_id, t["id"], since=cursor)
                yield from (_line(t, line) for line in page["lines"])
                cursor = page["next"]
                if not page["more"]:
                    break

    def follow_logs(
        self, job_id: int, *, task: str | None = None, poll_s: float = 1.0, settle_s: float = 2.0
    ) -> Iterator[LogLine]:
        """The job's lines as they are stored, until it has ended and its last lines are in (a restarted job's new
        tasks are followed too). Polls each task's cursor, so nothing is missed or repeated. A task's last lines may
        be stored a moment after the job ends (they travel apart from its state): after the end it keeps reading
        until a round brings nothing new and `settle_s` has passed."""
        cursors: dict[int, int] = {}
        ended_at: float | None = None
        while True:
            if ended_at is None and self.job(job_id).get("state") in TERMINAL_STATES:
                ended_at = time.monotonic()
            new = 0
            for t in self._followed_tasks(job_id, task, ended=ended_at is not None):
                while True:
                    page = self.log_page(job_id, t["id"], since=cursors.get(t["id"], -1))
                    new += len(page["lines"])
                    yield from (_line(t, line) for line in page["lines"])
                    cursors[t["id"]] = page["next"]
                    if not page["more"]:
                        break
            if ended_at is not None and not new and time.monotonic() - ended_at >= settle_s:
                return
            time.sleep(poll_s)

    def _followed_tasks(self, job_id: int, task: str | None, *, ended: bool) -> list[Task]:
        """The tasks a follow reads this round. A job still waiting for its placement (`tfdash submit` then `tfdash
        logs -f --task worker:0` at once; passes are seconds apart) has no tasks yet: the named one is waited for
        while the job has none and has not ended; a name its tasks do not have is refused as without --follow."""
        tasks = self.tasks(job_id)
        if task is not None and not tasks and not ended:
            return []
        return self._select_tasks(job_id, task, tasks)

    def _select_tasks(self, job_id: int, task: str | None, tasks: list[Task] | None = None) -> list[Task]:
        if tasks is None:
            tasks = self.tasks(job_id)
        if task is None:
            return tasks
        chosen = [t for t in tasks if task_label(t) == task or str(t.get("id")) == task]
        if not chosen:
            known = ", ".join(task_label(t) for t in tasks) or "none yet"
            raise NotFound(f"Job {job_id} has no task {task!r} (its tasks: {known}).")
        return chosen

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

    # --- clusters, queue, experiments -----------------------------------------------------------------------------
    def clusters(self) -> list[dict[str, Any]]:
        body = self._request("GET", "/api/clusters/")
        return list(body["results"] if isinstance(body, dict) else body)

    def queue(self, cluster_id: int) -> Any:
        """The cluster's queue (`GET /api/clusters/<id>/queue/`); Unsupported when the server has no queue API."""
        self._request("GET", f"/api/clusters/{int(cluster_id)}/")  # NotFound: no such cluster
        try:
            return self._request("GET", f"/api/clusters/{int(cluster_id)}/queue/")
        except NotFound:
            raise Unsupported(
                f"{self.url} does not offer the queue API (GET /api/clusters/<id>/queue/); it needs a newer server."
            ) from None

    def priority_classes(self) -> list[dict[str, Any]]:
        """Every priority class and who may use it (`GET /api/priority-classes/`); Unsupported on an older server."""
        try:
            body = self._request("GET", "/api/priority-classes/")
        except NotFound:
            raise Unsupported(f"{self.url} does not list priority classes; it needs a newer server.") from None
        return [c for c in body if isinstance(c, dict)] if isinstance(body, list) else []

    def experiments(self) -> list[dict[str, Any]]:
        body = self._request("GET", "/api/experiments/")
        return list(body["results"] if isinstance(body, dict) else body)

    def experiment(self, experiment_id: int) -> dict[str, Any]:
        return dict(self._request("GET", f"/api/experiments/{int(experiment_id)}/"))

    def create_experiment(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start a compare-strategies experiment: a job's fields without its shape, plus `variants` (2-8 of
        {strategy, workers, ps, devices_per_worker}), `mode` and `target_accuracy`."""
        return dict(self._request("POST", "/api/experiments/", json=dict(body)))

    # --- transport ------------------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise Unreachable(f"{self.url}{path} answered something that is not JSON: is it a tfdash server?") from None

    def _send(self, method: str, path: str, *, accept: str | None = None, **kwargs: Any) -> httpx.Response:
        headers = {"Accept": accept} if accept else None
        try:
            response = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.TimeoutException:
            raise Unreachable(f"{self.url} did not answer in time.") from None
        except httpx.HTTPError as exc:
            raise Unreachable(f"Cannot reach {self.url}: {exc}.") from None
        if response.status_code >= 400:
            self._raise_for(response, method, path)
        return response

    def _raise_for(self, response: httpx.Response, method: str, path: str) -> NoReturn:
        """The TfdashError an error answer (4xx, 5xx) means."""
        body = _json_or_none(response)
        detail = body.get("detail") if isinstance(body, dict) else None
        status = response.status_code
        if status in (401, 403):
            raise AuthError(str(detail or "Not allowed.") + (" Run `tfdash login URL`." if status == 401 else ""))
        if status == 404:
            raise NotFound(str(detail or "Not found."))
        if status in (400, 409, 413, 429):
            errors = body if isinstance(body, dict) else {"detail": response.text[:500]}
            raise Refused(error_text(errors) or f"Refused ({status}).", errors)
        raise Unreachable(f"{self.url} answered {status} to {method} {path}.")


def task_label(task: Mapping[str, Any]) -> str:
    return f"{task.get('type')}:{task.get('index')}"


def _line(task: Task, line: Mapping[str, Any]) -> LogLine:
    return {
        "task": task_label(task),
        "task_id": int(task["id"]),
        "seq": int(line["seq"]),
        "stream": str(line["stream"]),
        "text": str(line["text"]),
    }


def _form_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


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
