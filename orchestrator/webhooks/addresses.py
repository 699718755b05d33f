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
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast
