"""The agent's command line refuses bad input with a clear message before connecting anywhere."""

from __future__ import annotations

import pytest

from worker_agent.cli import parse_args


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--host", "a", "--token", "t", "--port-range", "80-90"],
            "ports must satisfy 1024 <= first <= last",
        ),
        (
            ["--host", "a", "--token", "t", "--port-range", "23099-23000"],
            "ports must satisfy 1024 <= first <= last",
        ),
        (["--host", "a", "--token", "t", "--port-range", "lots"], "is not a port range like 23000-23099"),
        (["--host", "Not_A_Host", "--token", "t"], "is not a host name"),
        (["--host", "a"], "an agent token is required"),
        (
            ["--host", "a", "--token", "t", "--heartbeat-interval", "0"],
            "--heartbeat-interval must be between",
        ),
    ],
)
def test_it_rejects_bad_arguments(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("TFDASH_AGENT_TOKEN", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)

    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_it_reads_the_token_from_the_environment(monkeypatch):
    monkeypatch.setenv("TFDASH_AGENT_TOKEN", "tfa_from_env")

    args = parse_args(["--host", "gpu-1", "--port-range", "23000-23099"])

    assert args.token == "tfa_from_env"
    assert args.port_range == (23000, 23099)
