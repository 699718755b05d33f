"""Name rules both sides check: what a host, an artifact and a metric may be called."""

from __future__ import annotations

import re

# Host names become Celery queue names (`agent.<name>`) and appear in TF_CONFIG: DNS-label-like.
HOST_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOST_NAME_RULE = "lower-case letters, digits and hyphens (up to 63, not starting or ending with a hyphen)"

# What a name that becomes a path part may hold (an artifact's name, a part of the TensorBoard archive's paths,
# orchestrator/metrics/tensorboard.py): ASCII letters, digits, '_', '.', '-' (never '/', '\\', a control character or
# a non-ASCII one, which some unpackers and terminals interpret). A regex character class's body.
PATH_PART_CHARS = "A-Za-z0-9_.-"

# An artifact is stored, listed and downloaded under its name (`/api/jobs/<id>/artifacts/<name>/`): a plain file name.
ARTIFACT_NAME_PATTERN = rf"[{PATH_PART_CHARS}]{{1,100}}"
ARTIFACT_NAME = re.compile(rf"^{ARTIFACT_NAME_PATTERN}$")
ARTIFACT_NAME_RULE = "1 to 100 letters, digits, '_', '.' or '-'"

# A metric's name is a series key on the page and a CSV value.
METRIC_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")


def is_host_name(value: str) -> bool:
    return bool(HOST_NAME.match(value))


def artifact_name_problem(name: object) -> str:
    """Why `name` cannot name an artifact, or "" when it can."""
    if not isinstance(name, str) or not ARTIFACT_NAME.match(name) or name in (".", ".."):
        return f"an artifact name is {ARTIFACT_NAME_RULE}, not {str(name)[:100]!r}"
    return ""
