"""docker-compose.yml validates with a real compose binary (not the pip wrapper, which exits 0 on any file)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import compose
import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = Path(compose.__file__).resolve().parent / "docker-compose"


SECRETS = {
    "SECRET_KEY": "k" * 50,
    "POSTGRES_PASSWORD": "pg-pw",
    "REDIS_PASSWORD": "redis-pw",
    "DJANGO_SUPERUSER_PASSWORD": "admin-pw",
    "TFDASH_CONTROL_KEY": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
}

# Flags that take a password as the next argument (redis-cli, redis-server, others); a URL with user:password@.
PASSWORD_FLAGS = {"-a", "--pass", "--password", "--requirepass"}
URL_WITH_PASSWORD = re.compile(r"://[^/@\s:]*:[^/@\s]+@")


def compose_config(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # Only what the test gives: no .env, no variable of the machine's own.
    return subprocess.run(
        [str(COMPOSE), "-f", str(path), "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=path.parent,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **(SECRETS if env is None else env)},
    )


def test_the_compose_file_validates_with_every_service():
    import json

    result = compose_config(ROOT / "docker-compose.yml")

    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert set(services) == {"redis", "postgres", "web", "orchestrator", "scheduler", "webhooks", "ingest", "agent-1",
                             "agent-2"}  # fmt: skip
    # Scheduler passes in a worker of their own, one at a time, and webhook deliveries in another; the orchestrator's
    # worker takes everything else.
    queues = {name: services[name]["command"][services[name]["command"].index("-Q") + 1] for name in ("orchestrator",
              "scheduler", "webhooks")}  # fmt: skip
    assert queues == {"orchestrator": "orchestrator", "scheduler": "scheduler", "webhooks": "webhooks"}
    assert services["agent-1"]["command"][:3] == ["python", "-m", "worker_agent"]
    assert services["web"]["ports"][0]["host_ip"] == "127.0.0.1"  # not published on every interface by default
    assert services["web"]["environment"]["SECRET_KEY"] == SECRETS["SECRET_KEY"]
    assert services["orchestrator"]["environment"]["TFDASH_CONTROL_KEY"] == SECRETS["TFDASH_CONTROL_KEY"]
    # An agent gets no secret of the control plane's, no token or broker URL on its command line, runs as root so its
    # tasks get uids of their own, and mounts its own token alone (not the other agent's).
    for number in (1, 2):
        agent = services[f"agent-{number}"]
        assert set(agent["environment"]) == {"PYTHONUNBUFFERED", "TFDASH_SERVER", "TFDASH_TASK_UIDS"}
        assert agent["environment"]["TFDASH_SERVER"] == "redis://redis:6379/0"  # signs in as its host, no password
        assert agent["user"] == "root"
        assert "--token" not in agent["command"] and "--server" not in agent["command"]
        assert "--control-key-file" in agent["command"]
        assert [v["source"] for v in agent["volumes"]] == [f"agent-{number}-secrets"]
        assert {v["source"]: v["target"] for v in services["web"]["volumes"]}[f"agent-{number}-secrets"] == (
            f"/tokens/compose-{number}"
        )


def test_no_secret_is_on_any_command_line():
    """Every user of the machine reads every process's arguments (`ps`, /proc/PID/cmdline; a container's processes
    are the host's too): no service's command, entrypoint or health check may carry a secret, a password flag or a
    URL with a password in it. The Redis service reads its password from its environment instead."""
    import json

    result = compose_config(ROOT / "docker-compose.yml")
    assert result.returncode == 0, result.stderr

    found = []
    for name, service in json.loads(result.stdout)["services"].items():
        for part in ("command", "entrypoint", "healthcheck"):
            value = service.get(part)
            words = value.get("test") if isinstance(value, dict) else value
            words = [words] if isinstance(words, str) else list(words or [])
            found += [f"{name} {part}: {secret} in {word!r}" for word in words for secret, text in SECRETS.items()
                      if text in word]  # fmt: skip
            found += [f"{name} {part}: password flag {word!r}" for word in words if word in PASSWORD_FLAGS]
            found += [f"{name} {part}: {word!r}" for word in words if URL_WITH_PASSWORD.search(word)]
    assert not found
    assert json.loads(result.stdout)["services"]["redis"]["environment"]["REDISCLI_AUTH"] == SECRETS["REDIS_PASSWORD"]


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_it_refuses_to_start_without_each_secret(missing: str):
    result = compose_config(ROOT / "docker-compose.yml", {k: v for k, v in SECRETS.items() if k != missing})

    assert result.returncode != 0
    assert f"set {missing} in .env" in result.stderr


def test_the_check_fails_on_a_broken_file(tmp_path: Path):
    broken = tmp_path / "docker-compose.yml"
    shutil.copy(ROOT / "Dockerfile", tmp_path / "Dockerfile")
    broken.write_text((ROOT / "docker-compose.yml").read_text().replace("depends_on:", "depends_onn:", 1))

    result = compose_config(broken)

    assert result.returncode != 0
    assert "depends_onn" in result.stderr
