from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# The web server's database connections come from a pool (config/settings_database.py; TFDASH_DB_POOL=0 in its
# environment turns it off). The variable is set only while Django reads its settings: no process started from here
# inherits it, nor does a test process that imports this module.
_pool_by_default = "TFDASH_DB_POOL" not in os.environ
if _pool_by_default:
    os.environ["TFDASH_DB_POOL"] = "1"
try:
    # Django must be set up before anything imports models (the WebSocket routes do).
    django_asgi_app = get_asgi_application()
finally:
    if _pool_by_default:
        del os.environ["TFDASH_DB_POOL"]

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from dashboard.routing import websocket_urlpatterns  # noqa: E402
from orchestrator.checks import require_control_key  # noqa: E402

# The web server runs no system checks: without a usable control key (it seals host keys and shows the key agents
# pin) it stops here, at start-up, saying why.
require_control_key()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
