"""Register (or refresh) the local cluster the quick start runs: N hosts on this machine, disjoint port ranges.

Prints one JSON object: the control plane's public key (every agent pins it) and, per host, a fresh agent token, for
the process that starts the agents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from contracts.environments import interpreter_problem
from orchestrator.identity import tokens
from orchestrator.identity.keys import control_public_key
from orchestrator.models import Cluster, Host, TaskEnvironment

FIRST_PORT = 23000
DEFAULT_ENVIRONMENT = "local-venv"
PORTS_PER_HOST = 100


class Command(BaseCommand):
    help = "Create or refresh the 'local' cluster of agents on this machine and print their tokens as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hosts", type=int, default=2)
        parser.add_argument("--cluster", default="local")
        parser.add_argument("--first-port", type=int, default=FIRST_PORT)
        parser.add_argument(
            "--address-is-name",
            action="store_true",
            help="each host's address is its own name (one container per agent, as in docker-compose)",
        )
        parser.add_argument(
            "--token-dir",
            type=Path,
            help="also write each host's token to DIR/<host>/token (mode 0600) beside the control public key "
            "(DIR/<host>/control.pub): one folder per host, so each agent can be given its own alone",
        )
        parser.add_argument("--shared-dir", default="", help="the cluster's shared folder for checkpoints/artifacts")
        parser.add_argument(
            "--environment",
            default="",
            help="register this interpreter (an absolute path, e.g. the venv's bin/python) as the cluster's default "
            f"task environment, named {DEFAULT_ENVIRONMENT!r}; blank: none (tasks run in the agents' interpreter)",
        )

    @transaction.atomic
    def handle(
        self,
        *args: Any,
        hosts: int,
        cluster: str,
        first_port: int,
        address_is_name: bool,
        token_dir: Path | None,
        shared_dir: str,
        environment: str,
        **options: Any,
    ) -> None:
        the_cluster, _ = Cluster.objects.get_or_create(
            name=cluster, defaults={"description": "Agents on this machine, started by `make run`."}
        )
        if shared_dir and the_cluster.shared_dir != shared_dir:
            # Every local agent sees this machine's disk, so checkpoints survive a restart on another local host.
            the_cluster.shared_dir = shared_dir
            the_cluster.save(update_fields=["shared_dir"])
        if environment:
            self._default_environment(the_cluster, environment)
        out = []
        for number in range(1, hosts + 1):
            low = first_port + (number - 1) * PORTS_PER_HOST
            # TF listens on 0.0.0.0, so local agents need disjoint ranges even on one address.
            name = f"{cluster}-{number}"
            host, _ = Host.objects.get_or_create(
                cluster=the_cluster,
                name=name,
                defaults={
                    "address": name if address_is_name else "127.0.0.1",
                    "port_min": low,
                    "port_max": low + PORTS_PER_HOST - 1,
                },
            )
            token = tokens.issue(host)
            if token_dir is not None:
                host_dir = token_dir / host.name
                host_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                token_file = host_dir / "token"
                token_file.touch(mode=0o600, exist_ok=True)
                token_file.write_text(token)
                # Beside the token, for an agent started with --control-key-file.
                (host_dir / "control.pub").write_text(control_public_key() + "\n")
            out.append({"host": host.name, "token": token, "port_range": f"{host.port_min}-{host.port_max}"})
        # The public key every agent pins to check the orders it is sent.
        self.stdout.write(json.dumps({"cluster_id": the_cluster.pk, "control_key": control_public_key(), "hosts": out}))

    @staticmethod
    def _default_environment(cluster: Cluster, interpreter: str) -> None:
        """The cluster's default task environment is `interpreter` (its agents probe it on their hello)."""
        problem = interpreter_problem(interpreter)
        if problem:
            raise CommandError(f"--environment: {problem}")
        TaskEnvironment.objects.filter(cluster=cluster, is_default=True).exclude(name=DEFAULT_ENVIRONMENT).update(
            is_default=False
        )
        TaskEnvironment.objects.update_or_create(
            cluster=cluster,
            name=DEFAULT_ENVIRONMENT,
            defaults={"interpreter": interpreter, "is_default": True, "labels": "the quick start's own venv"},
        )
