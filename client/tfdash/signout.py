"""`tfdash logout`: revoke the token `tfdash login` stored on the server that issued it, then forget it here.

A token only forgotten locally would go on working for anyone who copied the file (a backup, a shared home) until it
expired, so the server is asked first; when it cannot be reached the token is kept, so the logout can be run again.
"""

from __future__ import annotations

from tfdash import config
from tfdash.client import Client
from tfdash.errors import AuthError, NotFound, Unreachable

STILL_VALID = "it still works on the server until it expires, or until you revoke it on the server's API tokens page"


def sign_out(*, local_only: bool = False) -> str:
    """Revoke and forget the stored token; what happened, in a line. Unreachable (the token kept) when the server
    could not be asked."""
    stored = config.load(environment=False)
    if not stored.token:
        config.forget()
        return "No token was stored."
    if local_only or not stored.url:
        config.forget()
        return f"Token removed from this machine; {STILL_VALID}."
    try:
        with Client(stored.url, stored.token) as api:
            api.revoke_own_token()
        outcome = "revoked on the server"
    except AuthError:
        outcome = "no longer accepted by the server (it had expired or was revoked)"
    except NotFound:  # a server from before tokens could be revoked
        outcome = f"not revoked: {stored.url} cannot revoke tokens, so {STILL_VALID}"
    except Unreachable as exc:
        raise Unreachable(
            f"{exc} The token was not revoked and is kept: run `tfdash logout` again, or `tfdash logout --local` to "
            "only forget it here."
        ) from None
    config.forget()
    return f"Token {outcome}; removed from this machine."
