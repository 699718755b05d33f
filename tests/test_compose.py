"""docker-compose.yml validates with a real compose binary (not the pip wrapper, which exits 0 on any file)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import compose

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = Path(compose.__file__).resolve().parent / "docker-compose"


def compose_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(COMPOSE), "-f", str(path), "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=path.parent,
    )


def test_the_compose_file_validates_with_every_service():
    import json

    result = compose_config(ROOT / "docker-compose.yml")

    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert set(services) == {"redis", "postgres", "web", "orchestrator", "ingest", "agent-1", "agent-2"}
    assert services["agent-1"]["command"][:3] == ["python", "-m", "worker_agent"]


def test_the_check_fails_on_a_broken_file(tmp_path: Path):
    broken = tmp_path / "docker-compose.yml"
    shutil.copy(ROOT / "Dockerfile", tmp_path / "Dockerfile")
    broken.write_text((ROOT / "docker-compose.yml").read_text().replace("depends_on:", "depends_onn:", 1))

    result = compose_config(broken)

    assert result.returncode != 0
    assert "depends_onn" in result.stderr
