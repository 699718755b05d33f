"""Fixtures the end-to-end orchestrator tests share."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


@pytest.fixture
def api(alice) -> APIClient:  # type: ignore[no-untyped-def]
    """The REST API as alice (tests/conftest.py), who owns the jobs she submits."""
    client = APIClient()
    client.force_authenticate(alice)
    return client
