"""Validation of host definitions, shared by the admin form and the REST serializer (both call Host.clean)."""

from __future__ import annotations

import ipaddress
import re

from django.core.exceptions import ValidationError

from contracts.limits import PORT_MAX, PORT_MIN
from contracts.names import HOST_NAME_RULE, is_host_name

_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_LABEL = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def validate_host_name(value: str) -> None:
    if not is_host_name(value):
        raise ValidationError(
            f"Use {HOST_NAME_RULE}, e.g. gpu-node-1: the name becomes the agent's queue name agent.<name>.",
            code="host_name",
        )


def validate_address(value: str) -> None:
    """An IPv4/IPv6 address or a DNS host name; TF_CONFIG uses it as the task's `address:port`."""
    try:
        ipaddress.ip_address(value)
        return
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    numeric = all(label.isdigit() for label in labels)
    if not value or len(value) > 253 or numeric or not all(_DNS_LABEL.match(label) for label in labels):
        raise ValidationError(
            "Enter an IP address or a DNS host name (e.g. 10.0.0.5 or gpu-1.lab.example).", code="address"
        )


def validate_port(value: int) -> None:
    if not PORT_MIN <= value <= PORT_MAX:
        raise ValidationError(
            f"Port {value} is outside {PORT_MIN}–{PORT_MAX}: ports below {PORT_MIN} are privileged "
            f"and {PORT_MAX} is the highest TCP port.",
            code="port",
        )


def validate_port_range(port_min: int | None, port_max: int | None) -> None:
    if port_min is not None and port_max is not None and port_min > port_max:
        raise ValidationError(
            {"port_max": f"The range is inverted: the last port ({port_max}) is below the first ({port_min})."},
            code="port_range",
        )


def parse_labels(value: str) -> list[str]:
    """`gpu, fast-net` -> ['fast-net', 'gpu']; raises on a label that is not a simple token."""
    labels = sorted({item.strip().lower() for item in value.split(",") if item.strip()})
    bad = [label for label in labels if not _LABEL.match(label)]
    if bad:
        raise ValidationError(
            f"Labels are comma-separated words of letters, digits, '-', '_' or '.': {', '.join(bad)} is not.",
            code="labels",
        )
    return labels


def validate_labels(value: str) -> None:
    parse_labels(value)
