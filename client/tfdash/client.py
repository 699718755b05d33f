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

`Client` is here with its token and cluster, queue and experiment calls; it builds on api_transport.py (HTTP, errors
from answers), api_jobs.py, api_logs.py and api_artifacts.py; errors.py and api_types.py hold what it raises and
returns (all importable from here too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfdash import config
from tfdash.api_artifacts import ArtifactsApi
from tfdash.api_logs import LogsApi
from tfdash.api_transport import DEFAULT_TIMEOUT_S
from tfdash.api_types import TERMINAL_STATES, Job, LogLine, Task, task_label
from tfdash.errors import AuthError, NotFound, Refused, TfdashError, Unreachable, Unsupported, error_text

__all__ = [
    "TERMINAL_STATES",
    "AuthError",
    "Client",
    "Job",
    "LogLine",
    "NotFound",
    "Refused",
    "Task",
    "TfdashError",
    "Unreachable",
    "Unsupported",
    "error_text",
    "task_label",
]


class Client(LogsApi, ArtifactsApi):
    """One tfdash server, signed in with an API token (`Authorization: Token ...`)."""

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

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def usage(
        self,
        *,
        start: str | None = None,
        end: str | None = None,
        by: str = "user",
        user: str | None = None,
        group: str | None = None,
        cluster: str | None = None,
    ) -> dict[str, Any]:
        """Device usage per UTC day and account (`GET /api/usage/`): `start`/`end` are YYYY-MM-DD (the API's `from`
        and `to`), `by` user, group or cluster. Returns `accounts` (each one's totals) and `days` (per day, account and
        kind). Refused for a bad period, AuthError for another user's usage, Unsupported on an older server."""
        asked = {"from": start, "to": end, "by": by, "user": user, "group": group, "cluster": cluster}
        try:
            body = self._request("GET", "/api/usage/", params={k: v for k, v in asked.items() if v})
        except NotFound:
            raise Unsupported(
                f"{self.url} does not offer the usage API (GET /api/usage/); it needs a newer server."
            ) from None
        return dict(body)

    def experiments(self) -> list[dict[str, Any]]:
        body = self._request("GET", "/api/experiments/")
        return list(body["results"] if isinstance(body, dict) else body)

    def experiment(self, experiment_id: int) -> dict[str, Any]:
        return dict(self._request("GET", f"/api/experiments/{int(experiment_id)}/"))

    def create_experiment(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start a compare-strategies experiment: a job's fields without its shape, plus `variants` (2-8 of
        {strategy, workers, ps, devices_per_worker}), `mode` and `target_accuracy`."""
        return dict(self._request("POST", "/api/experiments/", json=dict(body)))
