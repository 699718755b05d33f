"""The agent's command line refuses bad input with a clear message before connecting anywhere, and takes its token
only from a file or the environment (then gone from the environment), keeping just the key derived from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts.signing import agent_mac_key, public_key_text
from worker_agent.cli import parse_args

CONTROL_KEY = public_key_text(Ed25519PrivateKey.generate().public_key())


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "agent.token"
    path.write_text("tfa_from_file\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host", "a", "--port-range", "80-90"], "ports must satisfy 1024 <= first <= last"),
        (["--host", "a", "--port-range", "23099-23000"], "ports must satisfy 1024 <= first <= last"),
        (["--host", "a", "--port-range", "lots"], "is not a port range like 23000-23099"),
        (["--host", "Not_A_Host"], "is not a host name"),
        (["--host", "a", "--heartbeat-interval", "0"], "--heartbeat-interval must be between"),
        (["--host", "a", "--control-key", "not-a-key"], "--control-key: not a base64 Ed25519 public key"),
        (["--host", "a", "--control-key", ""], "the control plane's public key is required"),
        (["--host", "a", "--shared-root", "mnt/shared"], "--shared-root mnt/shared: must be an absolute path"),
    ],
)
def test_it_rejects_bad_arguments(argv, message, capsys, monkeypatch, token_file):
    monkeypatch.delenv("TFDASH_AGENT_TOKEN", raising=False)
    monkeypatch.delenv("TFDASH_CONTROL_PUBLIC_KEY", raising=False)
    if "--control-key" not in argv:
        argv = [*argv, "--control-key", CONTROL_KEY]
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*argv, "--token-file", str(token_file)])

    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_it_requires_a_token(capsys, monkeypatch):
    monkeypatch.delenv("TFDASH_AGENT_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--host", "a", "--control-key", CONTROL_KEY])

    assert "an agent token is required: --token-file FILE or env TFDASH_AGENT_TOKEN" in capsys.readouterr().err


def test_there_is_no_token_flag(capsys, monkeypatch):
    """A flag shows in `ps` to every user of the machine."""
    monkeypatch.setenv("TFDASH_AGENT_TOKEN", "tfa_from_env")
    with pytest.raises(SystemExit):
        parse_args(["--host", "a", "--control-key", CONTROL_KEY, "--token", "tfa_on_the_command_line"])

    assert "unrecognized arguments: --token" in capsys.readouterr().err


def test_it_takes_the_token_from_the_environment_and_removes_it(monkeypatch):
    monkeypatch.setenv("TFDASH_AGENT_TOKEN", "tfa_from_env")

    args = parse_args(["--host", "gpu-1", "--port-range", "23000-23099", "--control-key", CONTROL_KEY])

    assert "TFDASH_AGENT_TOKEN" not in os.environ  # no child process can inherit it
    assert args.mac_key == agent_mac_key("tfa_from_env", "gpu-1")
    assert not any("tfa_from_env" in repr(value) for value in vars(args).values())  # only the derived key is kept
    assert public_key_text(args.control_key) == CONTROL_KEY
    assert args.port_range == (23000, 23099)


def test_it_reads_the_token_and_control_key_from_files(monkeypatch, token_file, tmp_path):
    monkeypatch.delenv("TFDASH_AGENT_TOKEN", raising=False)
    key_file = tmp_path / "control.pub"
    key_file.write_text(CONTROL_KEY + "\n")

    args = parse_args(["--host", "gpu-1", "--token-file", str(token_file), "--control-key-file", str(key_file)])

    assert args.mac_key == agent_mac_key("tfa_from_file", "gpu-1")
    assert public_key_text(args.control_key) == CONTROL_KEY


def test_the_shared_roots_come_from_the_flag_or_the_environment(monkeypatch, token_file):
    monkeypatch.setenv("TFDASH_SHARED_ROOT", "/mnt/a:/mnt/b")
    common = ["--host", "a", "--control-key", CONTROL_KEY, "--token-file", str(token_file)]

    assert parse_args(common).shared_roots == [Path("/mnt/a"), Path("/mnt/b")]
    flagged = parse_args([*common, "--shared-root", "/nfs/one", "--shared-root", "/nfs/two"])
    assert flagged.shared_roots == [Path("/nfs/one"), Path("/nfs/two")]  # the flag wins over the environment
    monkeypatch.delenv("TFDASH_SHARED_ROOT")
    assert parse_args(common).shared_roots == []
