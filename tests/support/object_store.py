"""A real S3 for tests: a moto server process (`python -m moto.server`) behind a SigV4 gate process
(tests/support/sigv4_gate.py, which checks presigned URLs' signatures as S3 does and moto does not), a bucket, and
a credentials file of the kind a control plane keeps (0600)."""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from tests.support.ports import free_port
from tests.support.processes import ROOT, ManagedProcess

BUCKET = "tfdash-test"
KEY_ID = "AKIATFDASHTEST000001"


@dataclass
class ObjectStore:
    endpoint: str  # the gate: what a cluster names
    moto: str  # moto itself (unchecked presigned URLs: only for the tests' own inspection)
    bucket: str
    credentials_file: Path
    secret: str

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=self.secret,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )

    def use_for(self, cluster: Any) -> None:
        cluster.store_endpoint = self.endpoint
        cluster.store_bucket = self.bucket
        cluster.store_region = "us-east-1"
        cluster.store_path_style = True
        cluster.store_credentials_file = str(self.credentials_file)
        cluster.save()

    def empty(self) -> None:
        s3 = self.client()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for item in page.get("Contents", []):
                s3.delete_object(Bucket=self.bucket, Key=item["Key"])


def _wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()  # noqa: S310 - the test's own local server
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextmanager
def running_store(address: str = "127.0.0.1") -> Iterator[ObjectStore]:
    """The store; its gate (what clusters name and presigned URLs point at) listens on `address`, e.g. a bridge's for
    hosts with addresses of their own (tests/support/netns.py). moto itself stays on loopback, behind the gate."""
    folder = Path(tempfile.mkdtemp(prefix="tfdash-test-store-"))
    secret = secrets.token_urlsafe(30)
    credentials = folder / "credentials"
    credentials.write_text(f"[default]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {secret}\n")
    credentials.chmod(0o600)
    secret_file = folder / "gate-secret"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    moto_port, gate_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    moto = ManagedProcess(
        "moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)], env, ROOT
    )
    gate_argv = [sys.executable, "-m", "tests.support.sigv4_gate", str(gate_port), f"http://127.0.0.1:{moto_port}"]
    gate = ManagedProcess("sigv4-gate", [*gate_argv, KEY_ID, str(secret_file), address], env, ROOT)
    try:
        _wait_http(f"http://127.0.0.1:{moto_port}/moto-api/")
        _wait_http(f"http://{address}:{gate_port}/")
        store = ObjectStore(
            f"http://{address}:{gate_port}", f"http://127.0.0.1:{moto_port}", BUCKET, credentials, secret
        )
        store.client().create_bucket(Bucket=BUCKET)
        yield store
    finally:
        gate.stop()
        moto.stop()
