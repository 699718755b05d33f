"""Settings, every one overridable from the environment.

Safe by default: DEBUG is off and SECRET_KEY must come from the environment. `make run` (scripts/run_local.py) turns
DEBUG on and generates a SECRET_KEY into `var/` (mode 0600) for the local quick start; a deployment sets SECRET_KEY,
DATABASE_URL, REDIS_URL and ALLOWED_HOSTS, and TFDASH_HTTPS=1 when it is served over HTTPS.

The settings are in four modules by concern: this one (Django itself: apps, middleware, HTTPS, templates, sign-in,
static files, the REST API, logging), config/settings_database.py, config/settings_redis.py (Redis, Celery, cache,
Channels) and config/settings_tfdash.py (tfdash's own knobs and its periodic tasks); DJANGO_SETTINGS_MODULE names
this one, which takes theirs in.
"""

from __future__ import annotations

from pathlib import Path

from config.env import env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("TFDASH_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
# No default, not even with DEBUG on: a known key signs sessions anyone could forge.
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    raise RuntimeError("SECRET_KEY must be set (make run generates one into var/secret-key)")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "orchestrator",
    "dashboard",
]

MIDDLEWARE = [
    # First, so every response carries the policy (dashboard/csp.py): no inline script anywhere.
    "dashboard.csp.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "orchestrator.api.signin_limit.SignInLimitMiddleware",
    "dashboard.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Served over HTTPS (directly or behind a TLS proxy that sets X-Forwarded-Proto): cookies only over TLS, HSTS, and
# plain HTTP redirected. Off by default, since `make run` and the tests serve plain HTTP on loopback.
TFDASH_HTTPS = env_bool("TFDASH_HTTPS", False)
if TFDASH_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("TFDASH_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("TFDASH_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("TFDASH_HSTS_INCLUDE_SUBDOMAINS", False)
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# DEBUG's error page (and error reports) hide passwords inside URLs too, not only settings named like a secret.
DEFAULT_EXCEPTION_REPORTER_FILTER = "config.error_reports.SecretURLFilter"

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# PostgreSQL: DATABASES and how connections are kept (config/settings_database.py).
from config.settings_database import *  # noqa: E402, F403

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:jobs"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# Serve straight from the app folders in development so `make run` needs no collectstatic.
WHITENOISE_USE_FINDERS = DEBUG

# Failed sign-ins (login page, admin, POST /api/token/) allowed per client address before it is locked out for the
# rest of the window.
TFDASH_LOGIN_MAX_FAILURES = env_int("TFDASH_LOGIN_MAX_FAILURES", 5, minimum=1)
TFDASH_LOGIN_LOCKOUT_S = env_int("TFDASH_LOGIN_LOCKOUT_S", 300, minimum=1)
# Failed sign-ins to one account, from any number of clients, before the account takes no sign-in for the rest of the
# window. Four times the per-client bound: one client alone can never lock someone else's account, while a guesser
# with many addresses (a botnet, IPv6 networks) still gets no more than this many tries per account per window.
TFDASH_LOGIN_ACCOUNT_MAX_FAILURES = env_int("TFDASH_LOGIN_ACCOUNT_MAX_FAILURES", 20, minimum=1)
# API tokens (orchestrator/identity/api_tokens.py): each expires this many days after the sign-in that made it.
TFDASH_API_TOKEN_DAYS = env_int("TFDASH_API_TOKEN_DAYS", 30, minimum=1)

# Redis, Celery, the cache and Channels (config/settings_redis.py).
from config.settings_redis import *  # noqa: E402, F403

CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Beat sends only while its process holds the `beat` lease (orchestrator/leases/beat.py): two beats never both send.
CELERY_BEAT_SCHEDULER = "orchestrator.leases.beat:LeasedScheduler"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "orchestrator.api.token_auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    # Throttles key on the client address; X-Forwarded-For is believed only through this many trusted proxies.
    "NUM_PROXIES": env_int("TFDASH_NUM_PROXIES", 0),
    "DEFAULT_THROTTLE_RATES": {"login": env_str("TFDASH_LOGIN_RATE", "20/min")},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "tfdash API",
    "DESCRIPTION": "Clusters, hosts and tf.distribute jobs.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "orchestrator.api.schema.declare_error_responses",
    ],
}

# tfdash's own settings and its periodic tasks (config/settings_tfdash.py).
from config.settings_tfdash import *  # noqa: E402, F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        # One line per heartbeat and watchdog tick would drown everything worth reading.
        # TFDASH_TRACE_LOG_LEVEL=INFO logs each handler's run time ("... succeeded in 0.004s"): bench/scale.py reads it.
        "celery.app.trace": {"level": env_str("TFDASH_TRACE_LOG_LEVEL", "WARNING")},
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.beat": {"level": "WARNING"},
    },
}
