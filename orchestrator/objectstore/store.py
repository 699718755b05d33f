"""A cluster's object store, seen from the control plane: the only holder of its credentials.

The credentials are read from the file the cluster names (Cluster.store_credentials_file: an AWS credentials INI,
`[default]` with aws_access_key_id and aws_secret_access_key, or plain key=value lines), never stored in the
database. Hosts get presigned URLs for their own job's keys (contracts/store.py), made here with boto3 (SigV4,
query-string signed: the signature covers method, bucket and key, so a URL is good for its one key only).
Presigning is local computation; only HEAD, DELETE and the bucket check speak to the store.
"""

from __future__ import annotations

import configparser
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from contracts import store as keys
from contracts.store import MAX_PRESIGN_S, StoreUrls
from orchestrator.models import Cluster, Task

log = logging.getLogger(__name__)

MAX_CREDENTIALS_FILE_BYTES = 64 * 1024
DOWNLOAD_URL_S = 600  # a download redirect is followed at once


class StoreUnavailable(RuntimeError):
    """The store cannot be used (no credentials file, a bad one, the store does not answer)."""


def read_credentials(path: str) -> tuple[str, str]:
    """(access key id, secret) from `path`; StoreUnavailable naming what is wrong (never the secret)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CREDENTIALS_FILE_BYTES + 1)
    except OSError as exc:
        raise StoreUnavailable(f"cannot read the store's credentials file {path}: {exc.strerror}") from None
    if len(raw) > MAX_CREDENTIALS_FILE_BYTES:
        raise StoreUnavailable(f"the store's credentials file {path} is too large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StoreUnavailable(f"the store's credentials file {path} is not UTF-8") from None
    values: dict[str, str] = {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text if text.lstrip().startswith("[") else "[default]\n" + text)
    except configparser.Error:
        raise StoreUnavailable(f"the store's credentials file {path} is neither INI nor key=value lines") from None
    sections = parser.sections()
    if not sections:
        raise StoreUnavailable(f"the store's credentials file {path} names no access key id and secret")
    section = parser["default"] if "default" in sections else parser[sections[0]]
    for name, value in section.items():
        values[name.strip().lower()] = value.strip().strip('"')
    key_id = values.get("aws_access_key_id") or values.get("access_key_id") or values.get("access_key")
    secret = values.get("aws_secret_access_key") or values.get("secret_access_key") or values.get("secret_key")
    if not key_id or not secret:
        raise StoreUnavailable(f"the store's credentials file {path} names no access key id and secret")
    return key_id, secret


def client(cluster: Cluster) -> Any:
    """A boto3 S3 client for the cluster's store (SigV4, its addressing style)."""
    key_id, secret = read_credentials(cluster.store_credentials_file)
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path" if cluster.store_path_style else "virtual"},
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=5,
        # No default CRC trailers (aws-chunked bodies): not every S3-compatible store takes them.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        read_timeout=30,
    )
    return boto3.client(
        "s3",
        endpoint_url=cluster.store_endpoint,
        region_name=cluster.store_region or "us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=config,
    )


def presign(s3: Any, bucket: str, method: str, key: str, expires: int = MAX_PRESIGN_S, **params: Any) -> str:
    operation = {"GET": "get_object", "PUT": "put_object", "HEAD": "head_object"}[method]
    url: str = s3.generate_presigned_url(
        operation, Params={"Bucket": bucket, "Key": key, **params}, ExpiresIn=min(int(expires), MAX_PRESIGN_S)
    )
    return url


def authoritative(task: Task, has_chief: bool) -> bool:
    """Whose checkpoint is the job's: the chief's, else worker 0's (TensorFlow lets only it write; see TF_NOTES)."""
    if has_chief:
        return task.type == "chief"
    return task.type == "worker" and task.index == 0


def task_urls(s3: Any, task: Task, has_chief: bool, expires: int = MAX_PRESIGN_S) -> dict[str, Any]:
    """The `store` field of the task's launch order: its job's keys only."""
    bucket = task.job.cluster.store_bucket
    job_id = task.job_id
    urls = StoreUrls(
        manifest_get=presign(s3, bucket, "GET", keys.manifest_key(job_id), expires),
        slot_get={slot: presign(s3, bucket, "GET", keys.slot_key(job_id, slot), expires) for slot in keys.SLOTS},
        artifact_put=[
            presign(s3, bucket, "PUT", keys.artifact_key(job_id, task.pk, task.attempt, n), expires)
            for n in range(keys.ARTIFACT_SLOTS)
        ],
    )
    if authoritative(task, has_chief):
        urls = StoreUrls(
            manifest_get=urls.manifest_get,
            slot_get=urls.slot_get,
            manifest_put=presign(s3, bucket, "PUT", keys.manifest_key(job_id), expires),
            slot_put={slot: presign(s3, bucket, "PUT", keys.slot_key(job_id, slot), expires) for slot in keys.SLOTS},
            artifact_put=urls.artifact_put,
        )
    return asdict(urls)


def object_size(cluster: Cluster, key: str) -> int | None:
    """The stored object's size, None when there is none (or the store does not answer: logged)."""
    try:
        head = client(cluster).head_object(Bucket=cluster.store_bucket, Key=key)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code not in ("404", "NoSuchKey", "NotFound"):
            log.warning("store of cluster %s: HEAD %s failed: %s", cluster.pk, key, code)
        return None
    except (BotoCoreError, StoreUnavailable) as exc:
        log.warning("store of cluster %s: HEAD %s failed: %s", cluster.pk, key, exc)
        return None
    return int(head["ContentLength"])


def delete(cluster: Cluster, key: str) -> None:
    """Best effort: an object no row names any more."""
    try:
        client(cluster).delete_object(Bucket=cluster.store_bucket, Key=key)
    except (BotoCoreError, ClientError, StoreUnavailable) as exc:
        log.warning("store of cluster %s: could not delete %s: %s", cluster.pk, key, exc)


def download_url(cluster: Cluster, key: str, filename: str) -> str:
    """A short-lived GET URL for a user's download (the API redirects to it)."""
    return presign(
        client(cluster),
        cluster.store_bucket,
        "GET",
        key,
        DOWNLOAD_URL_S,
        ResponseContentDisposition=f'attachment; filename="{filename}"',
    )


def credentials_file_problem(path: str) -> str:
    """Why the file cannot serve (for the admin form), or ""."""
    if not path:
        return ""
    if not Path(path).is_absolute():
        return "an absolute path on the control plane"
    try:
        read_credentials(path)
    except StoreUnavailable as exc:
        return str(exc)
    return ""
