"""Submit (or only plan) a job from a terminal: the same validation and scheduling as the browser and the API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.control import submission
from orchestrator.models import Cluster, Job, ProgramKind, Strategy


class Command(BaseCommand):
    help = "Submit a tf.distribute job, or print its placement and TF_CONFIGs with --plan."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("script", type=Path, help="the training script (.py)")
        parser.add_argument("--owner", required=True, help="username the job belongs to")
        parser.add_argument("--name", help="job name (default: the script's name)")
        parser.add_argument("--strategy", choices=Strategy.values, default=Strategy.MULTI_WORKER_MIRRORED)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--ps", type=int, default=0)
        parser.add_argument("--devices-per-worker", type=int, default=1)
        parser.add_argument("--cluster", help="cluster name (default: the first)")
        parser.add_argument("--labels", default="")
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
            upload = submission.Upload(filename=path.name, content=path.read_bytes())
        except OSError as exc:
            raise CommandError(f"Cannot read {path}: {exc.strerror}.") from None
        try:
            job = Job(
                owner=owner,
                cluster=cluster,
                name=o["name"] or path.stem,
                strategy=o["strategy"],
                program_kind=ProgramKind.SCRIPT,
                args=submission.parse_args(o["script_args"]),
                workers=o["workers"],
                ps=o["ps"],
                devices_per_worker=o["devices_per_worker"],
                labels=o["labels"],
            )
            if o["plan"]:
                submission.validate(job, upload)
                self.stdout.write(json.dumps(submission.describe_plan(job), indent=2))
                return
            submission.submit(job, upload)
        except submission.JobInvalid as exc:
            raise CommandError("; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.errors.items())) from None
        self.stdout.write(f"job {job.pk} queued on cluster {cluster.name}")
