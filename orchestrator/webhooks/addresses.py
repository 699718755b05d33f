"""Where a webhook may be sent (SSRF): every address its host resolves to must be public, unless staff allowed a
private one for that hook. Checked when it is registered and again at every delivery (DNS may have changed since),
and the POST goes to the very address checked, never to a name resolved again later."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

SCHEMES = {"http": 80, "https": 443}
MAX_URL_CHARS = 2000


class Refused(Exception):
    """The URL may not be posted to; the message says why (shown on the page and in the delivery log)."""


def url_problem(url: str) -> str:
    """Why `url` cannot be a webhook's, as far as its text goes ("" when it can)."""
    if len(url) > MAX_URL_CHARS:
        return f"a URL of at most {MAX_URL_CHARS} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a URL"
    if parts.scheme not in SCHEMES:
        return "only http:// and https:// URLs"
    if not parts.hostname:
        return "the URL names no host"
    if parts.username is not None or parts.password is not None:
        return "no user or password in the URL (the signature authenticates the sender)"
    if parts.fragment:
        return "no #fragment"
    del port
    return ""


def target(url: str, *, allow_private: bool) -> tuple[str, str, int, str]:
    """(scheme, host name, port, the one address to connect to) after checking every address the name has."""
    problem = url_problem(url)
    if problem:
        raise Refused(problem)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or SCHEMES[parts.scheme]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Refused(f"cannot resolve {host}: {exc}") from None
    addresses = sorted({info[4][0] for info in infos})
    if not addresses:
        raise Refused(f"{host} has no address")
    if not allow_private:
        for address in addresses:
            if not is_public(address):
                raise Refused(f"{host} resolves to {address}, a private, loopback or reserved address")
    return parts.scheme, host, port, addresses[0]


def is_public(address: str) -> bool:
    """Whether the control plane may POST to `address` (without staff's leave). An IPv6 address that carries an IPv4
    address for a translator or tunnel to reach (embedded_ipv4) is public only when every address it carries is: a
    NAT64 gateway turns 64:ff9b::10.0.0.1 into 10.0.0.1 on its own network, and the stdlib's table calls it global."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        return _public(ip)
    if ip in LOCAL_NAT64:
        return False  # where its prefix ends (and so where the IPv4 address sits) is the network's choice: unknowable
    carried = embedded_ipv4(ip)
    if not all(_public(each) for each in carried):
        return False
    if carried and any(ip in net for net in CARRIERS):
        return True  # only a wrapper around that (public) IPv4 address: ::ffff:8.8.8.8, 64:ff9b::8.8.8.8
    return _public(ip)


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not ip.is_multicast


# IPv6 ranges that are nothing but a way of writing (or translating to) the IPv4 address in their last 32 bits.
CARRIERS = tuple(
    ipaddress.IPv6Network(net)
    for net in (
        "::ffff:0:0/96",  # IPv4-mapped
        "::ffff:0:0:0/96",  # IPv4-translated (SIIT, RFC 2765)
        "::/96",  # IPv4-compatible (deprecated; ::1 and :: carry 0.0.0.1 and 0.0.0.0, never public)
        "64:ff9b::/96",  # NAT64's well-known prefix (RFC 6052)
    )
)
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")  # local-use NAT64 (RFC 8215): any prefix length up to /96
SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
TEREDO = ipaddress.IPv6Network("2001::/32")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address `ip` carries for a translator, relay or tunnel to reach: the last 32 bits of the CARRIERS,
    6to4's gateway (bits 16-47), Teredo's server and client (the client's bits inverted), and ISATAP's interface
    identifier (`0:5efe` or `200:5efe` before the IPv4 address, under any prefix)."""
    found: list[ipaddress.IPv4Address] = []
    value = int(ip)
    low32 = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if any(ip in net for net in CARRIERS):
        found.append(low32)
    if ip in SIX_TO_FOUR:
        found.append(ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF))
    if ip in TEREDO:
        found.append(ipaddress.IPv4Address((value >> 64) & 0xFFFFFFFF))  # the Teredo server
        found.append(ipaddress.IPv4Address(~value & 0xFFFFFFFF))  # the client, obfuscated by inverting its bits
    if (value >> 32) & 0xFDFFFFFF == 0x00005EFE:  # ISATAP: 0000:5efe or 0200:5efe (the u/l bit set)
        found.append(low32)
    return found
