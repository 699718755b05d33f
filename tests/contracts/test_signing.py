"""The wire's authentication, both ways (contracts/signing.py): a message or order is accepted only as sealed or
signed, for its host and its kind, within the freshness window; every tampering is refused with its reason."""

from __future__ import annotations

import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts import signing
from contracts.signing import (
    Refused,
    agent_mac_key,
    load_private_key,
    load_public_key,
    open_order,
    open_sealed,
    private_key_text,
    public_key_text,
    seal,
    sign_order,
)

TOKEN = "tfa_the-token"
KEY = agent_mac_key(TOKEN, "gpu-1")
WRONG = agent_mac_key("tfa_wrong", "gpu-1")
CONTROL = Ed25519PrivateKey.generate()


def refused(call, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(Refused) as info:
        call(*args, **kwargs)
    return info.value.reason


# --- agent -> orchestrator -----------------------------------------------------------------------------------------
def test_the_mac_key_is_bound_to_the_token_and_the_host_and_is_not_the_token():
    assert len(KEY) == 32
    assert agent_mac_key(TOKEN, "gpu-1") == KEY  # the orchestrator derives the same key at registration
    assert agent_mac_key(TOKEN, "gpu-2") != KEY  # one token, another host: another key
    assert agent_mac_key("tfa_other", "gpu-1") != KEY
    assert TOKEN.encode() not in KEY


def test_a_sealed_message_opens_with_its_key_and_carries_no_token():
    envelope = seal(KEY, "gpu-1", "orchestrator.task_event", {"task_id": 3})

    opened = open_sealed(envelope, KEY, "orchestrator.task_event", max_age_s=60)

    assert (opened.host, opened.name, opened.body) == ("gpu-1", "orchestrator.task_event", {"task_id": 3})
    assert abs(opened.ts - time.time()) < 5 and len(opened.nonce) == 32
    wire = json.dumps(envelope)
    assert TOKEN not in wire and KEY.hex() not in wire


def test_two_sealings_of_one_body_differ_in_nonce():
    first, second = (seal(KEY, "gpu-1", "n", {}) for _ in range(2))
    assert open_sealed(first, KEY, "n", max_age_s=60).nonce != open_sealed(second, KEY, "n", max_age_s=60).nonce


def _tampered(field: str, value: object) -> dict:
    envelope = seal(KEY, "gpu-1", "orchestrator.task_event", {"task_id": 3})
    content = json.loads(envelope["signed"])
    content[field] = value
    return {**envelope, "signed": json.dumps(content)}


@pytest.mark.parametrize(
    ("envelope", "key", "reason"),
    [
        (_tampered("body", {"task_id": 4}), KEY, signing.BAD_CREDENTIALS),  # tampered body
        (_tampered("ts", time.time() + 1), KEY, signing.BAD_CREDENTIALS),  # the time is under the MAC too
        (_tampered("nonce", "0" * 32), KEY, signing.BAD_CREDENTIALS),
        (seal(KEY, "gpu-1", "orchestrator.task_event", {}), WRONG, signing.BAD_CREDENTIALS),
        (seal(KEY, "gpu-1", "orchestrator.task_event", {}), None, signing.BAD_CREDENTIALS),  # unknown host
        ({**seal(KEY, "gpu-1", "orchestrator.task_event", {}), "mac": "zz"}, KEY, signing.BAD_CREDENTIALS),
        ({**seal(KEY, "gpu-1", "orchestrator.task_event", {}), "host": "gpu-2"}, KEY, signing.MISDIRECTED),
        (seal(KEY, "gpu-1", "orchestrator.agent_heartbeat", {}), KEY, signing.MISDIRECTED),  # another message kind
        ({"host": "gpu-1", "token": TOKEN, "body": {}}, KEY, signing.MALFORMED),  # protocol 2
        (None, KEY, signing.MALFORMED),
        ([1, 2], KEY, signing.MALFORMED),
    ],
    ids=[
        "tampered body", "tampered time", "tampered nonce", "wrong key", "unknown host", "bad mac", "other host",
        "other kind", "old protocol", "None", "list",
    ],
)  # fmt: skip
def test_anything_not_sealed_by_the_hosts_key_for_this_message_is_refused(envelope, key, reason):
    assert refused(open_sealed, envelope, key, "orchestrator.task_event", max_age_s=60) == reason


@pytest.mark.parametrize("age", [61.0, -31.0, float("nan"), float("inf")], ids=["stale", "future", "nan", "inf"])
def test_a_message_outside_the_window_is_refused_as_stale(age):
    now = time.time()
    envelope = seal(KEY, "gpu-1", "n", {}, now=now - age)

    assert refused(open_sealed, envelope, KEY, "n", max_age_s=60, max_skew_s=30, now=now) == signing.STALE


def test_a_message_inside_the_window_is_accepted_at_both_ends():
    now = time.time()
    for age in (59.0, -29.0):
        open_sealed(seal(KEY, "gpu-1", "n", {}, now=now - age), KEY, "n", max_age_s=60, max_skew_s=30, now=now)


# --- orchestrator -> agent -----------------------------------------------------------------------------------------
def test_a_signed_order_opens_with_the_control_key():
    message = sign_order(CONTROL, "gpu-1", "agent.launch", {"task_id": 3})

    order = open_order(message, CONTROL.public_key(), "gpu-1", "agent.launch")

    assert (order.host, order.kind, order.body) == ("gpu-1", "agent.launch", {"task_id": 3})
    assert len(order.order_id) == 32 and abs(order.issued_at - time.time()) < 5
    assert sign_order(CONTROL, "gpu-1", "agent.launch", {})["order"] != message["order"]  # a fresh id each time


def _order_tampered(field: str, value: object) -> dict:
    message = sign_order(CONTROL, "gpu-1", "agent.launch", {"task_id": 3})
    content = json.loads(message["order"])
    content[field] = value
    return {**message, "order": json.dumps(content)}


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (_order_tampered("body", {"task_id": 4}), signing.BAD_CREDENTIALS),
        (_order_tampered("host", "gpu-2"), signing.BAD_CREDENTIALS),
        (_order_tampered("issued_at", time.time() + 5), signing.BAD_CREDENTIALS),
        (sign_order(Ed25519PrivateKey.generate(), "gpu-1", "agent.launch", {}), signing.BAD_CREDENTIALS),
        (sign_order(CONTROL, "gpu-2", "agent.launch", {}), signing.MISDIRECTED),
        (sign_order(CONTROL, "gpu-1", "agent.kill", {}), signing.MISDIRECTED),
        ({**sign_order(CONTROL, "gpu-1", "agent.launch", {}), "sig": "not base64!"}, signing.BAD_CREDENTIALS),
        ({"body": "{}", "mac": "0" * 64}, signing.MALFORMED),  # protocol 2's HMAC
        ({"order": "{}"}, signing.MALFORMED),  # unsigned
        (None, signing.MALFORMED),
    ],
    ids=["body", "host", "time", "wrong key", "other host", "other kind", "bad sig", "hmac", "unsigned", "None"],
)
def test_an_order_not_signed_by_the_pinned_key_for_this_host_and_kind_is_refused(message, reason):
    assert refused(open_order, message, CONTROL.public_key(), "gpu-1", "agent.launch") == reason


@pytest.mark.parametrize("age", [signing.ORDER_MAX_AGE_S + 1, -signing.MAX_CLOCK_SKEW_S - 1], ids=["stale", "future"])
def test_an_order_outside_the_window_is_refused(age):
    message = sign_order(CONTROL, "gpu-1", "agent.launch", {})

    reason = refused(open_order, message, CONTROL.public_key(), "gpu-1", "agent.launch", now=time.time() + age)

    assert reason == signing.STALE


def test_keys_round_trip_through_their_text_forms():
    assert public_key_text(load_public_key(public_key_text(CONTROL.public_key()))) == public_key_text(
        CONTROL.public_key()
    )
    again = load_private_key(private_key_text(CONTROL))
    assert public_key_text(again.public_key()) == public_key_text(CONTROL.public_key())
    with pytest.raises(ValueError, match="not a base64 Ed25519 public key"):
        load_public_key("tfa_not-a-key")
