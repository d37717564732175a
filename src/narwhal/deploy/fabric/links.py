"""Link facts per directed edge, and the fingerprint that decides whether a sample still holds.

Measured from both ends before any sample: each host's fabric interface (address, MTU, state),
the route its kernel picks to the peer (`ip -j route get PEER from SELF`), the tool's version;
with the transport, the test parameters, both hosts' SSH host keys and the edge's budget they
make the link record. A sample is reused only while that record is byte-for-byte the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from narwhal.core.documents import digest


@dataclass(frozen=True)
class Interface:
    name: str
    address: str | None  # the expected fabric address when the interface has it, else None
    addresses: tuple[str, ...]
    mtu: int | None
    up: bool


@dataclass(frozen=True)
class Route:
    dev: str
    source: str | None
    gateway: str | None


def parse_interface(text: str, name: str, expected: str) -> Interface | None:
    """`ip -j addr show dev NAME`: the interface, or None when the host has no such interface."""
    try:
        links = json.loads(text or "[]")
    except ValueError:
        raise ValueError(f"`ip -j addr show dev {name}` is not JSON") from None
    for link in links if isinstance(links, list) else []:
        if isinstance(link, dict) and link.get("ifname") == name:
            addrs = tuple(str(a.get("local")) for a in link.get("addr_info") or []
                          if isinstance(a, dict) and a.get("local"))
            mtu = link.get("mtu")
            return Interface(name, expected if expected in addrs else None, addrs,
                             int(mtu) if isinstance(mtu, int) else None,
                             "UP" in (link.get("flags") or []) or link.get("operstate") == "UP")
    return None


def parse_route(text: str) -> Route:
    """`ip -j route get DST from SRC`: the device, source and gateway the kernel chose."""
    try:
        routes = json.loads(text)
    except ValueError:
        raise ValueError(f"`ip -j route get` is not JSON: {text.strip()[:200]!r}") from None
    if not isinstance(routes, list) or not routes or not isinstance(routes[0], dict):
        raise ValueError("`ip -j route get` returned no route")
    r = routes[0]
    return Route(str(r.get("dev", "")), r.get("prefsrc") or r.get("src"), r.get("gateway"))


@dataclass(frozen=True)
class LinkRecord:
    """Everything a sample of one directed edge depends on."""

    edge: str
    source: str
    destination: str
    source_address: str
    destination_address: str
    source_interface: Interface
    destination_interface: Interface
    route: Route  # the producer's route to the consumer
    reverse_route: Route  # the consumer's route back (acknowledgements, the RDMA handshake)
    transport: dict[str, Any]
    tool_version: str
    test_parameters: dict[str, Any]
    host_keys: dict[str, str]

    def document(self) -> dict[str, Any]:
        def iface(i: Interface) -> dict[str, Any]:
            return {"name": i.name, "addresses": list(i.addresses), "mtu": i.mtu, "up": i.up}

        def route(r: Route) -> dict[str, Any]:
            return {"dev": r.dev, "source": r.source, "gateway": r.gateway}

        return {"edge": self.edge, "source": self.source, "destination": self.destination,
                "source_address": self.source_address,
                "destination_address": self.destination_address,
                "source_interface": iface(self.source_interface),
                "destination_interface": iface(self.destination_interface),
                "route": route(self.route), "reverse_route": route(self.reverse_route),
                "transport": self.transport, "tool_version": self.tool_version,
                "test_parameters": self.test_parameters, "host_keys": self.host_keys}

    @property
    def fingerprint(self) -> str:
        return digest(self.document())

    def route_problems(self) -> list[str]:
        """Why the edge would not run over the fabric as planned (before any sample)."""
        out = []
        for end, i, addr in (("source", self.source_interface, self.source_address),
                             ("destination", self.destination_interface,
                              self.destination_address)):
            if i.address is None:
                out.append(f"{end} interface {i.name} does not hold {addr} (it has "
                           f"{', '.join(i.addresses) or 'no address'})")
            if not i.up:
                out.append(f"{end} interface {i.name} is down")
        for label, r, iface, src in (("route", self.route, self.source_interface,
                                      self.source_address),
                                     ("reverse route", self.reverse_route,
                                      self.destination_interface, self.destination_address)):
            if r.dev != iface.name:
                out.append(f"the {label} leaves by {r.dev or 'no device'}, not the fabric "
                           f"interface {iface.name}")
            elif r.source not in (None, src):
                out.append(f"the {label} uses source {r.source}, not {src}")
        return out

    def mtu_mismatch(self) -> str | None:
        a, b = self.source_interface.mtu, self.destination_interface.mtu
        if a is not None and b is not None and a != b:
            return (f"MTU {a} on {self.source} {self.source_interface.name}, {b} on "
                    f"{self.destination} {self.destination_interface.name}")
        return None
