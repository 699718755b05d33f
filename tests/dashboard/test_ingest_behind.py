"""The cluster page tells the staff when the metrics ingest is behind (its oldest unstored entry older than
TFDASH_INGEST_BEHIND_S), and GET /metrics says so too; other users see no such line."""

from __future__ import annotations

import time

import pytest
import redis
from django.test import Client

from contracts import broker
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting_entry(redis_url):
    """A metric entry that has waited a minute on a host's stream, not stored."""
    host, _token = factories.host("behind-0")
    client = redis.Redis.from_url(redis_url)
    key = broker.stream(host.name, broker.METRICS)
    client.delete(key)
    client.xadd(key, {"name": "x", "envelope": "{}"}, id=f"{int(time.time() * 1000) - 60_000}-0")
    yield
    client.delete(key)


def test_the_staff_see_that_the_ingest_is_behind(django_user_model, waiting_entry, settings):
    settings.TFDASH_INGEST_BEHIND_S = 10.0
    staff = Client()
    staff.force_login(django_user_model.objects.create_user("root", password="pw-root-123", is_staff=True))
    user = Client()
    user.force_login(django_user_model.objects.create_user("ann", password="pw-ann-1234"))

    assert 'id="ingest-behind"' in staff.get("/clusters/").content.decode()
    assert 'id="ingest-behind"' not in user.get("/clusters/").content.decode()
    assert "tfdash_ingest_behind 1.0" in staff.get("/metrics").content.decode()


def test_no_line_while_the_ingest_keeps_up(django_user_model, settings):
    settings.TFDASH_INGEST_BEHIND_S = 10.0
    staff = Client()
    staff.force_login(django_user_model.objects.create_user("root", password="pw-root-123", is_staff=True))
    assert 'id="ingest-behind"' not in staff.get("/clusters/").content.decode()
    assert "tfdash_ingest_behind 0.0" in staff.get("/metrics").content.decode()
