"""Who may keep a job page's socket open: checked when it connects, and again for as long as it stays open.

Rights can end while a socket is open: the user signs out, is deactivated or deleted, loses staff, changes their
password (which ends their other sessions), or the job changes owner. So each socket (dashboard/consumers.py):
- joins a group of its session and one of its user (`groups`). A session that ends (signed out, or flushed: the
  session row deleted) tells its group at once, which closes the socket; any save or deletion of the user tells the
  user's group (after commit), and each of its sockets checks again;
- checks again on every change of its job (the job's hint, orchestrator/metrics/live.py);
- checks again every TFDASH_SOCKET_RECHECK_S (20 s: Daphne's WebSocket ping interval, the socket's heartbeat), which
  catches what sends no signal (a session expired, or removed by a bulk delete).

`current_user` is the rule: the user a request carrying this socket's session cookie would be signed in as now. It
reads the session store and the user's row afresh, and changes nothing (unlike Django's `get_user`, which flushes a
session whose password hash no longer matches). Groups are named by a digest of the session key: the key itself, a
credential, never travels through the channel layer.
"""

from __future__ import annotations

import hashlib
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.signals import user_logged_out
from django.contrib.sessions.models import Session
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from orchestrator.metrics import live
from orchestrator.models import Job

SESSION_ENDED = "session.ended"  # handled by the consumer's `session_ended`: close at once
ACCESS_CHANGED = "access.changed"  # handled by `access_changed`: check again


def _digest(session_key: str) -> str:
    return hashlib.sha256(session_key.encode("utf-8")).hexdigest()[:40]


def session_group(session_key: str) -> str:
    return f"session-{_digest(session_key)}"


def user_group(user_id: Any) -> str:
    return f"user-{user_id}"


def groups(scope: dict[str, Any]) -> list[str]:
    """The groups a socket of this scope joins, so that the end of its rights reaches it."""
    found = []
    session = scope.get("session")
    if session is not None and session.session_key:
        found.append(session_group(session.session_key))
    user = scope.get("user")
    if user is not None and user.is_authenticated:
        found.append(user_group(user.pk))
    return found


def current_user(scope: dict[str, Any]) -> Any | None:
    """The scope's user if a request with the scope's session would be signed in as that user now; else None (the
    session ended or expired, the password changed since, the user is inactive or gone)."""
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return None
    session = scope.get("session")
    if session is None:
        # A scope made by the server's own code, not by a browser (the tests'): the user's row decides.
        return get_user_model()._default_manager.filter(pk=user.pk, is_active=True).first()
    if not session.session_key:
        return None
    data = import_module(settings.SESSION_ENGINE).SessionStore(session.session_key).load()
    backend_path = data.get(BACKEND_SESSION_KEY)
    if str(data.get(SESSION_KEY)) != str(user.pk) or backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    fresh = load_backend(backend_path).get_user(user.pk)  # None when inactive (ModelBackend) or deleted
    if fresh is None:
        return None
    if hasattr(fresh, "get_session_auth_hash"):
        stored = data.get(HASH_SESSION_KEY) or ""
        hashes = [fresh.get_session_auth_hash(), *fresh.get_session_auth_fallback_hash()]
        if not stored or not any(constant_time_compare(stored, h) for h in hashes):
            return None
    return fresh


def may_watch(scope: dict[str, Any], job_id: int) -> bool:
    """Whether this socket may carry this job now: its session's user, now, may see the job (Job.visible_to)."""
    user = current_user(scope)
    return user is not None and Job.objects.visible_to(user).filter(pk=job_id).exists()


def _tell(group: str, kind: str, using: str | None = None) -> None:
    """After commit of the database the change was made in (the sockets read what was committed); a failure is
    logged (Redis away: the sockets check again within TFDASH_SOCKET_RECHECK_S)."""
    transaction.on_commit(lambda: live.send([(group, {"type": kind})], live.PUBLISH_TIMEOUT_S), using=using)


@receiver(user_logged_out, dispatch_uid="tfdash-socket-signed-out")
def _signed_out(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    session = getattr(request, "session", None)
    if session is not None and session.session_key:
        _tell(session_group(session.session_key), SESSION_ENDED)


@receiver(post_delete, sender=Session, dispatch_uid="tfdash-socket-session-deleted")
def _session_deleted(sender: Any, instance: Session, **kwargs: Any) -> None:
    # A flush (sign-out, a sign-in over another user's session) deletes the row, whoever asked for it. An expired
    # session (`clearsessions`) authorises no socket already: nothing to tell.
    if instance.expire_date > timezone.now():
        _tell(session_group(instance.session_key), SESSION_ENDED, kwargs.get("using"))


def _user_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    # Any save: deactivation, staff taken away, a new password; a check is a few queries per open socket.
    _tell(user_group(instance.pk), ACCESS_CHANGED, kwargs.get("using"))


def connect_user_signals() -> None:
    """Called from the app's ready(): the user model is known only then."""
    model = get_user_model()
    post_save.connect(_user_changed, sender=model, dispatch_uid="tfdash-socket-user-saved")
    post_delete.connect(_user_changed, sender=model, dispatch_uid="tfdash-socket-user-deleted")
