"""A job page's socket lives only as long as its rights: it closes at once when its session signs out or is flushed
(4401: the page reconnects, and is refused), when its user is deactivated, loses staff or changes password, when the
job is given to another owner (4403, the page's "not allowed"); and, by its periodic check, when its session expires
without a word. A socket of another session of the same user is
left alone. Sockets here go through the whole ASGI stack with a real session cookie, as a browser's do."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from importlib import import_module
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from config.asgi import application
from dashboard.consumers import FORBIDDEN, SESSION_ENDED
from tests.dashboard.test_job_socket import make_job, next_frame, read_history

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

CLOSE_WITHIN_S = 5.0


async def signed_in(user: Any) -> Client:
    client = Client()
    await sync_to_async(client.force_login)(user)
    return client


async def open_socket(client: Client, job_id: int) -> WebsocketCommunicator:
    """The job's socket as the browser of `client` opens it (its session cookie, this site's origin), read up to the
    host history, the last frame of a connect, so it is in its groups and live."""
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    socket = WebsocketCommunicator(
        application, f"/ws/jobs/{job_id}/", headers=[(b"origin", b"http://localhost"), (b"cookie", cookie.encode())]
    )
    connected, code = await socket.connect()
    assert connected, code
    await read_history(socket)
    await next_frame(socket, "hosts")
    return socket


async def close_code(socket: WebsocketCommunicator, within_s: float = CLOSE_WITHIN_S) -> int | None:
    """The code the server closes the socket with, waiting up to `within_s` (frames before it are skipped)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        message = await socket.receive_output(timeout=max(deadline - loop.time(), 0.01))
        if message["type"] == "websocket.close":
            await socket.disconnect()  # what the browser's side does next; the consumer then ends
            return message.get("code")


async def still_open(socket: WebsocketCommunicator, job: Any) -> bool:
    """The socket still carries the job: a change of the job reaches it as a `job` frame."""

    def touch() -> None:
        job.refresh_from_db()
        job.reason = f"touched {timezone.now().isoformat()}"
        job.save()

    await sync_to_async(touch)()
    frame = await next_frame(socket, "job", lambda f: f["reason"] == job.reason)
    return frame["state"] == job.state


async def test_signing_out_closes_that_sessions_socket_at_once_and_leaves_the_users_other_session_open(alice):
    _host, _token, job, _task = await sync_to_async(make_job)(alice)
    laptop, phone = await signed_in(alice), await signed_in(alice)
    on_laptop, on_phone = await open_socket(laptop, job.pk), await open_socket(phone, job.pk)

    response = await sync_to_async(laptop.post)("/accounts/logout/")
    assert response.status_code == 302

    assert await close_code(on_laptop) == SESSION_ENDED
    # The page reconnects by itself (any close but 4403): with the cookie it held, it is refused.
    again = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/", headers=on_laptop.scope["headers"])
    assert await again.connect() == (False, FORBIDDEN)
    assert await still_open(on_phone, job)
    await on_phone.disconnect()


async def test_a_flushed_session_closes_its_socket_at_once(alice):
    _host, _token, job, _task = await sync_to_async(make_job)(alice)
    client = await signed_in(alice)
    socket = await open_socket(client, job.pk)

    # What a sign-in over this session, or an admin removing it, does: the session is flushed from the store.
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    await sync_to_async(store.delete)()

    assert await close_code(socket) == SESSION_ENDED


async def test_deactivating_the_user_closes_their_socket_at_once(alice):
    _host, _token, job, _task = await sync_to_async(make_job)(alice)
    socket = await open_socket(await signed_in(alice), job.pk)

    def deactivate() -> None:
        alice.is_active = False
        alice.save()

    await sync_to_async(deactivate)()
    assert await close_code(socket) == FORBIDDEN


async def test_a_job_given_to_another_owner_closes_the_old_owners_socket(alice, bob):
    _host, _token, job, _task = await sync_to_async(make_job)(alice)
    socket = await open_socket(await signed_in(alice), job.pk)

    def give_to_bob() -> None:
        job.owner = bob
        job.save()

    await sync_to_async(give_to_bob)()
    assert await close_code(socket) == FORBIDDEN
    # The new owner may watch it.
    bobs = await open_socket(await signed_in(bob), job.pk)
    assert await still_open(bobs, job)
    await bobs.disconnect()


async def test_staff_who_lose_staff_lose_the_socket_of_someone_elses_job(alice, django_user_model):
    _host, _token, job, _task = await sync_to_async(make_job)(alice)
    carol = await sync_to_async(django_user_model.objects.create_user)("carol", password="pw-carol-123", is_staff=True)
    socket = await open_socket(await signed_in(carol), job.pk)

    def no_more_staff() -> None:
        carol.is_staff = False
        carol.save()

    await sync_to_async(no_more_staff)()
    assert await close_code(socket) == FORBIDDEN


async def test_a_changed_password_closes_the_sockets_of_the_users_other_sessions(alice):
    _host, _token, job, _task = await sync_to_async(make_job)(alice)
    socket = await open_socket(await signed_in(alice), job.pk)

    def new_password() -> None:
        alice.set_password("a-new-pw-456")
        alice.save()

    await sync_to_async(new_password)()
    assert await close_code(socket) == FORBIDDEN


async def test_a_session_that_expires_silently_is_closed_by_the_periodic_check(alice, settings):
    settings.TFDASH_SOCKET_RECHECK_S = 0.2
    _host, _token, job, _task = await sync_to_async(make_job)(alice)
    client = await signed_in(alice)
    socket = await open_socket(client, job.pk)
    # Several checks pass while the session is good.
    assert await socket.receive_nothing(timeout=1.0, interval=0.05)
    assert await still_open(socket, job)

    # Expired in the store: no signal is sent, only the periodic check can notice.
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    past = timezone.now() - timedelta(seconds=1)
    await sync_to_async(Session.objects.filter(session_key=key).update)(expire_date=past)

    assert await close_code(socket, within_s=2.0) == FORBIDDEN
