"""The ingest's host cache (orchestrator/metrics/lookups.py): a host and its key are read once per HOST_CACHE_S, an
unknown name too (a forger's flood does not reach the database), and a key that does not match is read again at once,
so a new token works for the next report."""

from __future__ import annotations

import pytest

from contracts.signing import agent_mac_key
from orchestrator.identity import tokens
from orchestrator.metrics.lookups import lookups
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def empty_cache():  # type: ignore[no-untyped-def]
    lookups.forget()
    yield
    lookups.forget()


def test_a_host_and_its_key_are_read_once_and_a_new_token_at_once(django_assert_num_queries):
    host, token = factories.host()
    host.save()
    with django_assert_num_queries(1):
        found, key = lookups.host(host.name)
    assert (found.pk if found else None, key) == (host.pk, agent_mac_key(token, host.name))
    with django_assert_num_queries(0):
        assert lookups.host(host.name)[1] == key  # cached
    new = tokens.issue(host)
    with django_assert_num_queries(1):  # the report's MAC did not match the cached key: read again
        assert lookups.host(host.name, fresh=True)[1] == agent_mac_key(new, host.name) != key


def test_an_unknown_name_is_cached_as_unknown(django_assert_num_queries):
    with django_assert_num_queries(1):
        assert lookups.host("nobody") == (None, None)
    with django_assert_num_queries(0):
        assert lookups.host("nobody", fresh=True) == (None, None)
