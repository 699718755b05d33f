"""Start-up checks: what the control plane cannot work without stops a process as it starts, not at its first use.

The control key signs every order to an agent and unlocks the hosts' MAC keys (orchestrator/identity/keys.py): a web
server, orchestrator or ingest without a usable one would start, look healthy, and fail at the first order, token or
report. `manage.py` commands (the ingest, `check`, `migrate`) run the system check below; the web server
(config/asgi.py) and the orchestrator's Celery worker (config/celery.py), which run no system checks, call
`require_control_key` themselves.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from orchestrator.identity.keys import control_private_key

HINT = "an Ed25519 key, PEM or base64 of the raw 32 bytes; `make run` generates one into var/control-key"


def require_control_key() -> None:
    """Raises ImproperlyConfigured saying what is wrong unless the control key loads."""
    try:
        control_private_key()
    except ImproperlyConfigured as exc:
        raise ImproperlyConfigured(f"{exc} ({HINT})") from None


@checks.register(checks.Tags.security)
def control_key_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        control_private_key()
    except ImproperlyConfigured as exc:
        return [checks.Critical(str(exc), hint=HINT, id="tfdash.E001")]
    return []
