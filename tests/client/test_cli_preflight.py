"""A preflight in the terminal (issue 45): `tfdash status` of a job waiting for its preflight says which and its
bound, of a refused job what its preflight said, and of a preflight the job it checks. The real command, in
process, against the real API (tests/client/test_cli_verdict.py's harness)."""

from __future__ import annotations

import pytest

from orchestrator.models import Job
from tests import factories
from tests.client.test_cli_verdict import run_cli

pytestmark = pytest.mark.django_db(transaction=True)  # each WSGI request closes the connection at its end


def test_status_says_what_the_preflight_is_doing_and_what_it_checks(alice, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line each
    cluster = factories.cluster()
    job = Job.objects.create(owner=alice, cluster=cluster, name="wide", strategy="multi_worker_mirrored",
                             program_kind="script", workers=2)  # fmt: skip
    run = Job.objects.create(owner=alice, cluster=cluster, name=f"preflight of #{job.pk}: wide", preflight_for=job,
                             strategy="multi_worker_mirrored", program_kind="script", workers=1)  # fmt: skip
    job.preflight = {"state": "running", "job": run.pk, "steps": 20, "limit_s": 150}
    job.save(update_fields=["preflight"])

    code, printed = run_cli(alice, monkeypatch, "status", str(job.pk))

    assert code == 0
    assert f"preflight: #{run.pk} running (at most 20 steps or 150 s on one worker)" in printed
    code, printed = run_cli(alice, monkeypatch, "status", str(run.pk))
    assert f"preflight: checks job {job.pk} (refused if this run fails)" in printed
    refused = f"refused by its preflight #{run.pk}: worker 0 on a raised ModuleNotFoundError"
    Job.objects.filter(pk=job.pk).update(state="failed", preflight={**job.preflight, "state": "failed",
                                                                     "reason": refused})  # fmt: skip
    code, printed = run_cli(alice, monkeypatch, "status", str(job.pk))
    assert f"preflight: {refused}" in printed
