"""A job's own environment variables: which names are the job's to set, and the bounds (contracts/job_env.py)."""

from __future__ import annotations

import pytest

from contracts import job_env


@pytest.mark.parametrize(
    "name",
    ["TF_CONFIG", "tf_config", "TFDASH_JOB_DIR", "TFDASH_ANYTHING", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH",
     "PYTHONHOME", "CUDA_VISIBLE_DEVICES", "GRPC_FAIL_FAST", "TF_USE_LEGACY_KERAS", "PYTHONINSPECT", "HOME", "PATH"],
)  # fmt: skip
def test_it_refuses_a_reserved_name_naming_it_and_saying_why(name):
    [problem] = job_env.problems({name: "x"})

    assert problem.startswith(f"{name} is reserved: ")
    assert len(problem) > len(f"{name} is reserved: ") + 10  # a reason follows


@pytest.mark.parametrize(
    "name", ["DATA", "data_dir", "_X", "TF_CPP_MIN_LOG_LEVEL", "OMP_NUM_THREADS", "WANDB_MODE", "PYTHONHASHSEED"]
)
def test_it_takes_ordinary_names(name):
    assert job_env.problems({name: "/shared/digits.npz"}) == []


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"1X": "v"}, "'1X' is not a variable name"),
        ({"A-B": "v"}, "'A-B' is not a variable name"),
        ({"": "v"}, "'' is not a variable name"),
        ({"A" * 129: "v"}, "is not a variable name"),
        ({"A": 1}, "A's value must be a string, not int"),
        ({"A": "x" * 4097}, "A's value is limited to 4096 characters, not 4097"),
        ({"A": "nul\x00"}, "NUL"),
        ({f"V{i}": "" for i in range(65)}, "at most 64 variables, not 65"),
        (["A=1"], "an object of names to string values, not list"),
    ],
)
def test_it_bounds_names_values_and_count(env, says):
    problems = job_env.problems(env)

    assert len(problems) == 1 and says in problems[0]


def test_assignments_keep_the_value_as_typed_and_say_what_is_wrong():
    env, problems = job_env.parse_assignments(["DATA=/a b=c", "", "  EMPTY=", "NOEQUALS", "DATA=again", "TF_CONFIG={}"])

    assert env == {"DATA": "/a b=c", "EMPTY": "", "TF_CONFIG": "{}"}
    assert problems == [
        "'NOEQUALS' is not NAME=value",
        "DATA is set twice",
        "TF_CONFIG is reserved: tfdash writes each task's cluster and role",
    ]
