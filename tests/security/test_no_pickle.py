"""Nothing in the control plane unpickles: no pickle in the product's code, the cache stores JSON, Celery takes JSON
only; and a pickle planted in the very cache key an anonymous sign-in reads runs nothing, while the sign-in gets its
ordinary answer.

The attack this closes: anyone able to write the control plane's Redis writes a pickle whose `__reduce__` runs a
command into `tfdash:1:signin-failures:until:<address>`; one anonymous POST /api/token/ then ran it in the web process,
which holds SECRET_KEY, the database's password and the control key.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from config.celery import app as celery_app

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("contracts", "orchestrator", "dashboard", "worker_agent", "config", "scripts")
PRODUCT_FILES = ("Dockerfile", "docker-compose.yml", "pyproject.toml", "Makefile")
SCANNED = {".py", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".json", ".sh", ".env"}

# Every way the product could come to unpickle: the modules (and those built on pickle), their load/dump calls, the
# serializer classes and names Django, Celery and Kombu know pickle by, NumPy's opt-in.
PICKLE_USE = re.compile(
    r"^\s*(?:import|from)\s+(?:c?pickle|_pickle|dill|cloudpickle|jsonpickle|shelve)\b"
    r"|\b(?:c?pickle|dill|cloudpickle)\s*\.\s*(?:loads?|dumps?|Unpickler|Pickler)\b"
    r"|PickleSerializer|\bRedisSerializer\b"
    r"|['\"](?:pickle|application/x-python-serialize)['\"]"
    r"|allow_pickle\s*=\s*True",
    re.MULTILINE | re.IGNORECASE,
)


def product_files() -> list[Path]:
    files = [ROOT / name for name in PRODUCT_FILES if (ROOT / name).exists()]
    for package in PRODUCT:
        files += [p for p in (ROOT / package).rglob("*") if p.is_file() and p.suffix in SCANNED]
    return files


def test_the_products_code_uses_no_pickle() -> None:
    files = product_files()
    assert len(files) > 100  # it really read the product
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0).strip()}"
        for path in files
        for text in [path.read_text(errors="replace")]
        for match in PICKLE_USE.finditer(text)
    ]
    assert found == []


@pytest.mark.parametrize(
    "line",
    [
        "import pickle",
        "from pickle import loads",
        "    import cPickle as p",
        "data = pickle.loads(raw)",
        '"serializer": "django.core.cache.backends.redis.RedisSerializer"',
        "SESSION_SERIALIZER = 'django.contrib.sessions.serializers.PickleSerializer'",
        'CELERY_ACCEPT_CONTENT = ["json", "pickle"]',
        "app.conf.task_serializer = 'pickle'",
        "np.load(path, allow_pickle=True)",
    ],
)
def test_the_scan_sees_each_way_of_using_pickle(line: str) -> None:
    assert PICKLE_USE.search(line)


@pytest.mark.parametrize("line", ["np.load(path, allow_pickle=False)", "# JSON, not Django's default pickle"])
def test_the_scan_lets_words_about_pickle_be(line: str) -> None:
    assert not PICKLE_USE.search(line)


def test_the_cache_and_celery_speak_json_only() -> None:
    for alias, cache_settings in settings.CACHES.items():
        if cache_settings["BACKEND"] == "django.core.cache.backends.redis.RedisCache":
            serializer = cache_settings.get("OPTIONS", {}).get("serializer")
            assert serializer == "config.cache_serializer.JSONCacheSerializer", alias
    conf = celery_app.conf
    assert conf.accept_content == ["json"]
    assert conf.result_accept_content == ["json"]
    assert (conf.task_serializer, conf.result_serializer, conf.event_serializer) == ("json", "json", "json")
    # What the cache writes into Redis: JSON for values, a plain integer for counters (INCR works on it).
    cache.set("json-check", {"a": [1.5, "x"]})
    cache.set("json-check-int", 41)
    cache.incr("json-check-int")
    raw = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    assert raw.get(cache.make_key("json-check")) == b'{"a":[1.5,"x"]}'
    assert raw.get(cache.make_key("json-check-int")) == b"42"
    assert cache.get("json-check") == {"a": [1.5, "x"]} and cache.get("json-check-int") == 42


class _Planted:
    """Unpickled, it creates `path`: proof that the pickle ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


@pytest.mark.django_db
def test_a_pickle_planted_in_the_sign_in_limits_keys_runs_nothing(alice, tmp_path: Path) -> None:
    proof = tmp_path / "pwned"
    payload = pickle.dumps(_Planted(str(proof)))
    # The proof is sound: this payload, unpickled, does create the file.
    pickle.loads(payload).close()  # noqa: S301 - the test's own payload
    assert proof.exists()
    proof.unlink()

    raw = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    address = "10.7.9.1"
    for key in (
        f"signin-failures:until:{address}",
        f"signin-failures:count:{address}",
        f"throttle_login_{address}",  # DRF's throttle history for POST /api/token/
    ):
        raw.set(cache.make_key(key), payload, ex=300)

    api = APIClient()
    right = {"username": "alice", "password": "pw-alice-123"}
    wrong = {"username": "alice", "password": "wrong"}
    assert api.post("/api/token/", wrong, REMOTE_ADDR=address).status_code == 400
    answer = api.post("/api/token/", right, REMOTE_ADDR=address)
    assert answer.status_code == 200 and answer.json()["token"]
    assert Client().post("/accounts/login/", wrong, REMOTE_ADDR=address).status_code == 200  # the form, again
    assert Client().post("/accounts/login/", right, REMOTE_ADDR=address).status_code == 302

    assert not proof.exists()
    # The lock still works for that address: failures are counted again from where the junk was.
    for _ in range(settings.TFDASH_LOGIN_MAX_FAILURES):
        api.post("/api/token/", wrong, REMOTE_ADDR=address)
    assert api.post("/api/token/", right, REMOTE_ADDR=address).status_code == 429
    assert not proof.exists()
