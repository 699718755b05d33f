"""What the client tests share: a real web server (Daphne) for `tfdash` to talk to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.conftest import WebServer
from tests.support.ports import free_port


@pytest.fixture
def web(service_env: dict[str, str], transactional_db: None) -> Iterator[WebServer]:
    server = WebServer({**service_env, "DJANGO_SETTINGS_MODULE": "tests.settings"}, free_port())
    server.start()
    yield server
    server.stop()
