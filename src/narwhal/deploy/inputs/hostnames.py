"""Host names and addresses: one grammar for SSH destinations, URLs and listen addresses.

A host is an IPv4 address (four decimal numbers 0-255 without leading zeros), an IPv6 address
(in brackets wherever a port could follow) or a DNS name per RFC 1123 (labels of letters, digits
and inner '-', 1-63 characters each, 253 in all). A name whose last label is all digits is read
as IPv4 and must be one: `999.999.1.1` is a typo rather than a host name, and getaddrinfo reads
`10.1` as 10.0.0.1. The canonical form (lower-case name, compressed IPv6) is what makes
`root@HOST` and `ssh://root@host:22` the same machine when ports are compared.
"""

from __future__ import annotations

import ipaddress
import re

LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
ZONE_RE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
MAX_NAME = 253
HOST_FORMS = ("an IPv4 address (10.0.0.5), an IPv6 address in brackets ([fd00::5]) or a DNS "
              "name (letters, digits and inner '-', dot-separated labels of up to 63 "
              "characters, 253 in all)")


def canonical_ipv6(text: str) -> str:
    """The compressed form of an IPv6 address, with an interface-name zone if it has one."""
    address, sep, zone = text.partition("%")
    if sep and not ZONE_RE.fullmatch(zone):
        raise ValueError("has an IPv6 zone that is not an interface name")
    try:
        parsed = ipaddress.IPv6Address(address)
    except ValueError:
        raise ValueError("has an invalid IPv6 address") from None
    return parsed.compressed + (f"%{zone}" if sep else "")


def canonical_ipv4(text: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise ValueError("has an invalid IPv4 address (four numbers 0-255, no leading "
                         "zeros)") from None


def canonical_host(text: str, *, bare_ipv6: bool = False) -> str:
    """The canonical form of one host, or ValueError saying what is wrong with it.

    `[v6]` is always accepted; a bare IPv6 address only with bare_ipv6 (where no port follows).
    """
    if text.startswith("[") and text.endswith("]"):
        return canonical_ipv6(text[1:-1])
    if ":" in text:
        if bare_ipv6:
            return canonical_ipv6(text)
        raise ValueError("has an invalid host (an IPv6 address goes in brackets)")
    labels = text.split(".")
    if labels[-1].isascii() and labels[-1].isdigit():
        return canonical_ipv4(text)
    if not text or len(text) > MAX_NAME or not all(LABEL_RE.fullmatch(label) for label in labels):
        raise ValueError("has an invalid host name")
    return text.lower()


def ip_address(text: str) -> str:
    """An unbracketed IPv4 or IPv6 address, canonical, or ValueError."""
    if ":" in text:
        return canonical_ipv6(text)
    return canonical_ipv4(text)


def listen_address(text: str) -> str:
    """`HOST:PORT` a server binds (Prometheus --web.listen-address): HOST may be empty (every
    interface), an IPv4 address, `[v6]` or a name; PORT 1-65535. Returns the canonical form."""
    host, sep, port = text.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port):
        raise ValueError("is not HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise ValueError("has a port outside 1-65535")
    if not host:
        return f":{int(port)}"
    canonical = canonical_host(host)
    shown = f"[{canonical}]" if ":" in canonical else canonical
    return f"{shown}:{int(port)}"
