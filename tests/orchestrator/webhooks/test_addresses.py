"""The webhook address filter refuses every IPv6 form that carries a non-public IPv4 address (a NAT64 gateway, a 6to4
or Teredo relay, an ISATAP router or the host's own stack would take the POST there), at registration and at each
delivery, and still lets through the same forms carrying a public address."""

from __future__ import annotations

import pytest

from orchestrator.webhooks import addresses, hooks, sending

# (form, an address of that form carrying a private IPv4 address). Those marked `went through` were allowed before
# this change (checked against the filter of HEAD~); `stdlib`: refused already because Python's own table calls the
# whole range non-global (a table that changes between Python versions: now they are looked inside of too);
# `mapped`: the one form the filter looked inside of before.
CARRYING_PRIVATE = [
    ("IPv4-mapped", "::ffff:10.0.0.1"),  # mapped
    ("IPv4-mapped loopback", "::ffff:127.0.0.1"),  # mapped
    ("IPv4-compatible", "::10.0.0.1"),  # went through
    ("IPv4-compatible metadata", "::169.254.169.254"),  # went through
    ("IPv4-translated (SIIT)", "::ffff:0:10.0.0.1"),  # went through
    ("NAT64 well-known prefix", "64:ff9b::10.0.0.1"),  # went through
    ("NAT64 well-known prefix, shared space", "64:ff9b::100.64.0.1"),  # went through
    ("NAT64 local-use prefix", "64:ff9b:1::a00:1"),  # stdlib
    ("6to4", "2002:a00:1::1"),  # stdlib
    ("6to4 of loopback", "2002:7f00:1::1"),  # stdlib
    ("Teredo, private client", "2001:0:4136:e378:8000:63bf:f5ff:fffe"),  # stdlib
    ("Teredo, private server", "2001:0:a00:1:8000:63bf:f7f7:f7f7"),  # stdlib
    ("ISATAP under a global prefix", "2a00:1450:4001::200:5efe:a00:1"),  # went through
    ("ISATAP, u/l bit clear", "2a00:1450:4001::5efe:c0a8:101"),  # went through
]
CARRYING_PUBLIC = ["::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2a00:1450:4001::200:5efe:808:808"]


@pytest.mark.parametrize(("form", "address"), CARRYING_PRIVATE, ids=[form for form, _ in CARRYING_PRIVATE])
def test_an_ipv6_form_carrying_a_non_public_ipv4_address_is_refused(form: str, address: str):
    assert not addresses.is_public(address), form
    # At delivery too: the POST is refused before any connection.
    answer = sending.post(f"http://[{address}]/x", b"{}", {}, b"k", allow_private=False, deadline_s=2)
    assert answer.status is None and "private, loopback or reserved" in answer.detail, answer.detail


@pytest.mark.django_db
@pytest.mark.parametrize("address", ["::10.0.0.1", "64:ff9b::10.0.0.1", "::ffff:0:10.0.0.1", "2a00:1450::5efe:a00:1"])
def test_registration_refuses_them_with_the_reason(alice, address: str):
    hook, secret, errors = hooks.create(alice, f"http://[{address}]:8080/hook")
    assert hook is None and secret == ""
    assert "private, loopback or reserved" in errors["url"][0], errors


@pytest.mark.parametrize("address", CARRYING_PUBLIC)
def test_the_same_forms_carrying_a_public_address_stay_allowed(address: str):
    assert addresses.is_public(address)


def test_what_each_form_carries():
    import ipaddress

    def carried(address: str) -> list[str]:
        return [str(a) for a in addresses.embedded_ipv4(ipaddress.IPv6Address(address))]

    assert carried("64:ff9b::a00:1") == ["10.0.0.1"]
    assert carried("2002:a00:1::1") == ["10.0.0.1"]
    assert carried("2001:0:4136:e378:8000:63bf:f5ff:fffe") == ["65.54.227.120", "10.0.0.1"]
    assert carried("2a00:1450::200:5efe:a00:1") == ["10.0.0.1"]
    assert carried("2606:4700::1111") == []
