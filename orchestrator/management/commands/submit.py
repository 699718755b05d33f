"""Submit (or only plan) a job from a terminal: the same validation and scheduling as the browser and the API."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.models import Cluster
from orchestrator.submit import job_fields, submission
from orchestrator.submit.job_fields import JobField


class Command(BaseCommand):
    help = "Submit a tf.distribute job, or print its placement and TF_CONFIGs with --plan."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("script", type=Path, help="the training script (.py)")
        parser.add_argument("--owner", required=True, help="username the job belongs to")
        parser.add_argument("--cluster", help="cluster name (default: the first)")
        for spec in job_fields.FIELDS:
            _add_argument(parser, spec)
        parser.add_argument(
            "--args", dest="script_args", default="", help='arguments for the script, e.g. "--epochs 3"'
        )
        parser.add_argument("--plan", action="store_true", help="validate and print the plan; launch nothing")

    def handle(self, *args: Any, **o: Any) -> None:
        owner = get_user_model().objects.filter(username=o["owner"]).first()
        if owner is None:
            raise CommandError(f"No user named {o['owner']!r}.")
        cluster = Cluster.objects.filter(name=o["cluster"]).first() if o["cluster"] else submission.default_cluster()
        if cluster is None:
            raise CommandError("No such cluster." if o["cluster"] else "No cluster is registered yet.")
        path: Path = o["script"]
        try:
            with path.open("rb") as file:  # one byte past the limit is enough to refuse it (submission.check_script)
                upload = submission.Upload(filename=path.name, content=file.read(settings.TFDASH_MAX_SCRIPT_BYTES + 1))
        except OSError as exc:
            raise CommandError(f"Cannot read {path}: {exc.strerror}.") from None
        try:
            data = {name: o[name] for name in job_fields.SHAPE_FIELDS}
            job, _ = submission.new_job(
                owner, cluster, {**data, "name": o["name"] or path.stem, "args": o["script_args"]}
            )
            if o["plan"]:
                submission.validate(job, upload)
                self.stdout.write(json.dumps(submission.describe_plan(job), indent=2))
                return
            submission.submit(job, upload)
        except submission.JobInvalid as exc:
            raise CommandError(
                "; ".join(
                    " ".join(msgs) if field == "non_field_errors" else f"{field}: {' '.join(msgs)}"
                    for field, msgs in exc.errors.items()
                )
            ) from None
        self.stdout.write(f"job {job.pk} queued on cluster {cluster.name}")


def _add_argument(parser: CommandParser, spec: JobField) -> None:
    """`--<field>` for one of the job's fields (orchestrator/submit/job_fields.py), with its bounds and default."""
    flag = "--" + spec.name.replace("_", "-")
    if spec.name == "name":
        parser.add_argument(flag, help="job name (default: the script's name)")
    elif spec.kind is bool:
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=spec.default, help=spec.label)
    elif spec.choices:
        parser.add_argument(flag, choices=[value for value, _label in spec.choices], default=spec.default)
    elif spec.kind is int:
        parser.add_argument(flag, type=_bounded(spec), default=spec.default, help=spec.help or None)
    else:
        parser.add_argument(flag, default=spec.default, help=spec.help or None)


def _bounded(spec: JobField) -> Any:
    def parse(text: str) -> int:
        value = int(text)
        if (spec.min is not None and value < spec.min) or (spec.max is not None and value > spec.max):
            raise argparse.ArgumentTypeError(f"{spec.name} must be between {spec.min} and {spec.max}, not {value}")
        return value

    parse.__name__ = spec.name  # argparse names the type in its message
    return parse
