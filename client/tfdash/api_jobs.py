"""The client's job calls: list, read, submit (a script uploaded, or a built-in program), cancel, wait for the end,
and read a job's metrics."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tfdash.api_transport import Transport
from tfdash.api_types import TERMINAL_STATES, Job, Task
from tfdash.errors import TfdashError


class JobsApi(Transport):
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


def _form_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
