"""The CLI's copy of the job's fields (client/tfdash/job_fields.json) is what the server's one definition says now:
one rule per bound, for the form, the API and the CLI."""

from __future__ import annotations

import argparse

import pytest
from tfdash import fields

from contracts.run_config import BOUNDS
from orchestrator.submit import job_fields
from scripts import gen_client_fields


def test_the_clients_copy_is_what_the_generator_writes_from_job_fields_now():
    assert gen_client_fields.TARGET.read_text() == gen_client_fields.render(), (
        "client/tfdash/job_fields.json is stale: run .venv/bin/python scripts/gen_client_fields.py"
    )


def test_the_cli_offers_every_field_with_the_servers_bound():
    by_name = {spec["name"]: spec for spec in (*fields.JOB_FIELDS, *fields.HYPERPARAMETERS, *fields.PROGRAM_FIELDS)}
    for spec in (*job_fields.FIELDS, *job_fields.HYPERPARAMETERS, *job_fields.PROGRAM_FIELDS):
        assert (by_name[spec.name].get("min"), by_name[spec.name].get("max")) == (spec.min, spec.max), spec.name
    for key in ("epochs", "per_replica_batch", "learning_rate", "warmup_epochs"):
        bound = BOUNDS[key]
        assert (by_name[key]["min"], by_name[key]["max"]) == (bound.low, bound.high)


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("learning_rate", "0", "learning_rate must be greater than 0"),  # run_config: above 0, as the runtime checks
        ("epochs", "0", "epochs must be at least 1"),
        ("workers", "257", "workers must be at most 256"),
        ("workers", "two", "workers must be a whole number"),
        ("learning_rate", "nan", "finite"),
    ],
)
def test_a_value_past_its_bound_is_refused_before_anything_is_sent(name, text, says):
    spec = next(s for s in (*fields.JOB_FIELDS, *fields.HYPERPARAMETERS) if s["name"] == name)

    with pytest.raises(argparse.ArgumentTypeError, match=says):
        fields.check(spec, text)


def test_a_servers_error_field_names_the_option_to_change():
    assert fields.option_for_field("builtin_config.epochs") == "--epochs"
    assert fields.option_for_field("devices_per_worker") == "--devices-per-worker"
    assert fields.option_for_field("non_field_errors") == ""
