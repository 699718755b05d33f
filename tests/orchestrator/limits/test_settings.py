"""A limit read from the environment must be a positive integer: a typo or a 0 fails at start-up, not later."""

from __future__ import annotations

import pytest

from config.env import EnvError, env_int


def test_a_limit_below_its_minimum_is_refused(monkeypatch):
    monkeypatch.setenv("TFDASH_MAX_ACTIVE_JOBS_PER_USER", "0")

    with pytest.raises(EnvError, match=r"TFDASH_MAX_ACTIVE_JOBS_PER_USER='0' is below its minimum, 1"):
        env_int("TFDASH_MAX_ACTIVE_JOBS_PER_USER", 20, minimum=1)


def test_a_limit_from_the_environment_and_its_default(monkeypatch):
    monkeypatch.setenv("TFDASH_MAX_ACTIVE_JOBS_PER_USER", "3")
    assert env_int("TFDASH_MAX_ACTIVE_JOBS_PER_USER", 20, minimum=1) == 3
    monkeypatch.delenv("TFDASH_MAX_ACTIVE_JOBS_PER_USER")
    assert env_int("TFDASH_MAX_ACTIVE_JOBS_PER_USER", 20, minimum=1) == 20
