"""The client's HTTP to one tfdash server: a token-signed httpx session, and each error answer turned into the
`TfdashError` it means (errors.py)."""

from __future__ import annotations

from typing import Any, NoReturn

import httpx

from tfdash.errors import AuthError, NotFound, Refused, Unreachable, error_text

DEFAULT_TIMEOUT_S = 30.0


class Transport:
    """A token-signed HTTP session with one tfdash server."""

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

    def close(self) -> None:
        self._http.close()

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


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
