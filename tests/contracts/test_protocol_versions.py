"""Protocol versions on the wire: agents one protocol behind are accepted, others refused with a reason staff can act
on, and orders to an older agent carry only what it knows."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts.signing import (
    MIN_AGENT_PROTOCOL,
    WIRE_VERSION,
    UnsupportedProtocol,
    agent_mac_key,
    open_order,
    open_sealed,
    seal,
    sign_order,
)
from contracts.task_messages import LAUNCH_KEYS_SINCE, launch_body_for

KEY = agent_mac_key("tfa_token", "gpu-1")


def test_the_wire_is_version_4_and_accepts_agents_one_behind():
    assert (WIRE_VERSION, MIN_AGENT_PROTOCOL) == (4, 3)


@pytest.mark.parametrize("protocol", [3, 4])
def test_it_opens_messages_of_the_protocols_it_accepts_and_says_which(protocol):
    opened = open_sealed(seal(KEY, "gpu-1", "x", {"a": 1}, protocol=protocol), KEY, "x", max_age_s=60)

    assert (opened.protocol, opened.body) == (protocol, {"a": 1})


def test_a_too_old_agent_is_refused_with_what_to_do():
    with pytest.raises(UnsupportedProtocol) as refused:
        open_sealed(seal(KEY, "gpu-1", "x", {}, protocol=2), KEY, "x", max_age_s=60)

    assert refused.value.protocol == 2
    assert refused.value.explain() == (
        "The agent speaks protocol 2, too old (this control plane accepts protocols 3 to 4): its messages are refused "
        "until it is upgraded and restarted (docs/upgrade.md)."
    )


def test_an_agent_newer_than_the_control_plane_is_told_to_upgrade_the_control_plane_first():
    with pytest.raises(UnsupportedProtocol) as refused:
        open_sealed(seal(KEY, "gpu-1", "x", {}, protocol=5), KEY, "x", max_age_s=60)

    assert "newer than this control plane" in refused.value.explain()
    assert "upgrade the control plane first" in refused.value.explain()


def test_what_staff_read_is_bounded_whatever_number_an_agent_claims():
    with pytest.raises(UnsupportedProtocol) as refused:
        open_sealed(seal(KEY, "gpu-1", "x", {}, protocol=10**400), KEY, "x", max_age_s=60)

    assert len(refused.value.explain()) < 300


def test_the_protocol_is_read_only_after_the_mac_is_checked():
    """A stranger cannot get a host marked as refused: a wrong MAC is a wrong MAC, whatever the protocol says."""
    from contracts.signing import BAD_CREDENTIALS, Refused

    with pytest.raises(Refused) as refused:
        open_sealed(seal(b"x" * 32, "gpu-1", "x", {}, protocol=2), KEY, "x", max_age_s=60)

    assert refused.value.reason == BAD_CREDENTIALS
    assert not isinstance(refused.value, UnsupportedProtocol)


def test_an_order_is_signed_in_the_protocol_asked_for():
    private = Ed25519PrivateKey.generate()
    order = sign_order(private, "gpu-1", "agent.kill", {"task_id": 1}, protocol=3)

    assert json.loads(order["order"])["protocol"] == 3
    # The agent of this version takes only its own: an order for a v3 agent is not one for it.
    with pytest.raises(ValueError, match="protocol 3"):
        open_order(order, private.public_key(), "gpu-1", "agent.kill")


def test_a_launch_body_for_an_agent_one_behind_has_no_key_of_the_newer_protocol():
    body = {"job_id": 1, "uid_slot": 4, "environment": "tf-2.17", "interpreter": "/opt/tf/bin/python"}

    assert launch_body_for(body, 3) == {"job_id": 1, "uid_slot": 4}  # uid_slot is protocol 3's own
    assert launch_body_for(body, 4) == body
    assert {"environment", "interpreter"} <= set(LAUNCH_KEYS_SINCE[4])


def test_every_key_a_newer_protocol_brought_is_a_launch_spec_field():
    """The list names real fields: a typo there would send a v3 agent a key it refuses."""
    from dataclasses import fields

    from contracts.task_messages import LaunchSpec

    names = {f.name for f in fields(LaunchSpec)}
    assert {key for keys in LAUNCH_KEYS_SINCE.values() for key in keys} <= names
