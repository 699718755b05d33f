"""`tfdash-agent` (worker_agent/command.py) without a control plane: what join checks in an answer, how it writes the
configuration (once, 0600), and the agent's arguments `run` makes from it. Joining a live control plane:
tests/agent_dist/test_installed_agent_e2e.py."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts.join import AGENT_JOIN, JoinConfig
from contracts.signing import public_key_text, sign_order
from worker_agent import command

CONTROL = Ed25519PrivateKey.generate()
CONTROL_KEY = public_key_text(CONTROL.public_key())


def answer(key: Ed25519PrivateKey = CONTROL, **changes: object) -> dict:
    config = {
        **asdict(JoinConfig("gpu-1", "redis://broker:6379/0", public_key_text(key.public_key()), (23000, 23099))),
        **changes,
    }
    return sign_order(key, "gpu-1", AGENT_JOIN, config)


def test_it_takes_an_answer_signed_by_the_pinned_key():
    config = command._check_answer(answer(), "gpu-1", command._load_key(CONTROL_KEY, "key"))

    assert (config.server, config.port_range) == ("redis://broker:6379/0", (23000, 23099))


def test_it_refuses_an_answer_signed_by_another_key_than_the_pinned_one():
    """A proxy or anyone on the way cannot swap the key the agent will trust for every order."""
    with pytest.raises(command.Failed, match="not signed by the control key given"):
        command._check_answer(answer(Ed25519PrivateKey.generate()), "gpu-1", command._load_key(CONTROL_KEY, "key"))


def test_it_refuses_an_answer_that_names_another_key_than_the_one_that_signed_it():
    other = public_key_text(Ed25519PrivateKey.generate().public_key())

    with pytest.raises(command.Failed, match="names another control key"):
        command._check_answer(answer(control_key=other), "gpu-1", command._load_key(CONTROL_KEY, "key"))


def test_without_a_pinned_key_it_trusts_the_answers_own_and_says_so(caplog):
    config = command._check_answer(answer(), "gpu-1", None)

    assert config.control_key == CONTROL_KEY
    assert "no --control-key given" in caplog.text


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"port_range": [80, 90]}, "port_range"),
        ({"shared_roots": ["relative/path"]}, "shared_roots"),
        ({"heartbeat_interval_s": float("nan")}, "heartbeat_interval_s"),
        ({"server": ""}, "server"),
    ],
)
def test_it_refuses_an_answer_with_a_bad_field_naming_it(changes, message):
    with pytest.raises(command.Failed, match=message):
        command._check_answer(answer(**changes), "gpu-1", command._load_key(CONTROL_KEY, "key"))


@pytest.mark.parametrize("url", ["ftp://cp.example", "cp.example", "https://user:pw@cp.example", "https://cp/?x=1"])
def test_it_refuses_what_is_not_a_control_planes_address(url):
    with pytest.raises(command.Failed):
        command._base_url(url)


def test_an_unreachable_control_plane_is_said_so(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("tfa_x")
    token.chmod(0o600)

    with pytest.raises(command.Failed, match="cannot reach the control plane"):
        command.join("http://127.0.0.1:9", "gpu-1", token, tmp_path / "config.json")
    assert not (tmp_path / "config.json").exists()


def test_the_configuration_is_written_once_and_only_for_its_user(tmp_path: Path):
    path = tmp_path / "etc" / "config.json"

    command._write_private(path, '{"a": 1}', replace=False)

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    with pytest.raises(command.Failed, match="exists already"):
        command._write_private(path, '{"a": 2}', replace=False)
    command._write_private(path, '{"a": 3}', replace=True)  # join --force
    assert json.loads(path.read_text()) == {"a": 3}
    assert sorted(os.listdir(path.parent)) == ["config.json"]  # nothing half-written left beside it


def written_config(tmp_path: Path, **changes: object) -> Path:
    config = {
        **asdict(JoinConfig("gpu-1", "redis://broker:6379/0", CONTROL_KEY, (23000, 23099), ["/mnt/shared"])),
        "port_range": "23000-23099",
        "token_file": "/etc/tfdash-agent/token",
        "workdir": "/var/lib/tfdash-agent",
        **changes,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_run_starts_the_agent_with_the_configurations_arguments(tmp_path: Path):
    argv = command.agent_argv(command.read_config(written_config(tmp_path)), "INFO")

    assert argv == [
        "--server", "redis://broker:6379/0", "--host", "gpu-1", "--control-key", CONTROL_KEY,
        "--token-file", "/etc/tfdash-agent/token", "--port-range", "23000-23099",
        "--heartbeat-interval", "3.0", "--log-level", "INFO", "--workdir", "/var/lib/tfdash-agent",
        "--shared-root", "/mnt/shared",
    ]  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="task uids need the agent to run as root")
def test_run_gives_the_fleets_task_uids_to_an_agent_running_as_root(tmp_path: Path):
    argv = command.agent_argv(command.read_config(written_config(tmp_path, task_uids="20000-29999")), "INFO")

    assert argv[-2:] == ["--task-uids", "20000-29999"]


@pytest.mark.parametrize(
    ("content", "message"),
    [("[1]", "not an object"), ('{"host": "gpu-1"}', "port_range"), ("x" * 70_000, "larger than")],
)
def test_run_refuses_a_file_that_is_not_a_configuration(tmp_path: Path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)

    with pytest.raises(command.Failed, match=message):
        command.read_config(path)


def test_run_without_a_configuration_says_to_join_first(tmp_path: Path, capsys):
    assert command.main(["run", "--config", str(tmp_path / "none.json")]) == 2

    assert "run `tfdash-agent join URL ...` first" in capsys.readouterr().err
