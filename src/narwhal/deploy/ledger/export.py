"""Export the deployment record with addresses (every IPv4 and IPv6 spelling), hardware
addresses, host names, user names, home paths, the paths the inputs name and secrets replaced
by stable aliases, and a manifest of what was replaced (kinds, aliases and counts; the
originals stay in the private alias map beside the record). What counts as private, and how
it is found, is `scan`'s job."""

from __future__ import annotations

import getpass
import ipaddress
import json
import re
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from narwhal.core.documents import sha256_bytes, stamp
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger.evidence import EvidenceWriter, Redactor, private_dir
from narwhal.deploy.ledger.scan import (
    HOME_RE,
    IPV4_RE,
    IPV6_RE,
    MAC_RE,
    address_key,
    path_pattern,
    private_ip,
    private_mac,
    private_paths,
    read_address,
)
from narwhal.deploy.ledger.store import Ledger

ALIAS_FILE = "export-aliases.json"
SKIP = {".lock", ALIAS_FILE}
# A map written before a kind existed simply has no table for it and loads as it was.
KINDS = ("secret", "address", "host", "user", "home", "path", "mac")


class Aliaser:
    """Stable original -> alias map per kind, persisted privately between exports."""

    def __init__(self, stored: dict[str, dict[str, str]]) -> None:
        self.map = {kind: dict(stored.get(kind, {})) for kind in KINDS}
        self.counts: Counter[tuple[str, str]] = Counter()

    def alias(self, kind: str, original: str) -> str:
        table = self.map[kind]
        if original not in table:
            table[original] = f"{kind}-{len(table) + 1}"
        self.counts[(kind, table[original])] += 1
        return table[original]


class Scrubber:
    """Applies every replacement to one file's bytes; patterns are compiled once per export.

    Order matters: secrets first (they may hold anything), then paths longest first and
    homes, then addresses the inputs name, any other private address, hardware addresses, and
    last host and user names, which could otherwise match inside a path or an address."""

    def __init__(self, inputs: Inputs, aliaser: Aliaser,
                 discovered_hosts: frozenset[str] = frozenset(), runs: Path | None = None) -> None:
        self.aliaser = aliaser
        self.secrets = {s.reveal().encode(): s.name or "unnamed" for s in inputs.secrets()}
        self.spelt = private_paths(inputs, runs)
        self.paths = path_pattern(self.spelt)
        dests = [inputs.router.ssh, *[e.ssh for e in inputs.engines]]
        addresses = {d.host for d in dests if _is_ip(d.host)}
        addresses |= {e.ip for e in inputs.engines if e.ip}
        # another spelling of a named address (`::ffff:10.0.0.5`, `FD00:0::5`) is that address
        self.named = {address_key(a): name for name in addresses
                      if (a := read_address(name)) is not None}
        hosts = {d.host for d in dests if not _is_ip(d.host)} | {socket.gethostname()} \
            | set(discovered_hosts)
        users = {d.user for d in dests if d.user} | {getpass.getuser()}
        # Known values longest first, so one never eats part of another; afterwards any
        # private address the record mentions that the inputs did not name.
        known: list[tuple[str, str, re.Pattern[bytes]]] = []
        for kind, names, before, after in (
                # a zoned form (`fe80::5%eth0`) is left whole for the generic scan
                ("address", addresses, rb"(?<![0-9A-Za-z.:])", rb"(?![0-9A-Za-z:%]|\.[0-9])"),
                # a host name followed by "-" is still that host (ids such as
                # `<hostname>-<pid>-<nonce>`): better aliased once too often than leaked
                ("host", hosts, rb"(?<![A-Za-z0-9_-])", rb"(?![A-Za-z0-9_])"),
                ("user", users, rb"(?<![A-Za-z0-9_-])", rb"(?![A-Za-z0-9_-])")):
            for name in sorted(names, key=len, reverse=True):
                pattern = re.compile(before + re.escape(name.encode()) + after)
                known.append((kind, name, pattern))
        # Named hosts and users are replaced after the generic address scan.
        self.addresses = [k for k in known if k[0] == "address"]
        self.words = [k for k in known if k[0] != "address"]

    def __call__(self, data: bytes) -> bytes:
        for value, name in self.secrets.items():
            if value in data:
                data = data.replace(value, f"<{self.aliaser.alias('secret', name)}>".encode())
        if self.paths is not None:
            data = self.paths.sub(self._bracketed("path", self.spelt), data)
        data = HOME_RE.sub(self._bracketed("home"), data)
        for kind, name, pattern in self.addresses:
            data = pattern.sub(self._named(kind, name), data)
        # IPv6 first: its IPv4-embedding forms must be read whole, not as an IPv4 tail
        for generic in (IPV6_RE, IPV4_RE):
            data = generic.sub(self._address, data)
        data = MAC_RE.sub(self._mac, data)
        for kind, name, pattern in self.words:
            data = pattern.sub(self._named(kind, name), data)
        return data

    def _named(self, kind: str, name: str) -> Callable[[re.Match[bytes]], bytes]:
        return lambda _match: self.aliaser.alias(kind, name).encode()

    def _bracketed(self, kind: str, spelt: dict[str, str] | None = None,
                   ) -> Callable[[re.Match[bytes]], bytes]:
        """`<kind-n>` for the match, keyed by what it spells when that is known."""
        def replace(match: re.Match[bytes]) -> bytes:
            text = match[0].decode()
            return f"<{self.aliaser.alias(kind, (spelt or {}).get(text, text))}>".encode()
        return replace

    def _address(self, match: re.Match[bytes]) -> bytes:
        text, tail = match[0], b""
        addr = read_address(text.decode())
        if addr is None and text.endswith(b":") and not text.endswith(b"::"):
            # `listening on fd00::1: ready`: the colon ends the sentence, not the address
            text, tail = text[:-1], b":"
            addr = read_address(text.decode())
        if addr is None:
            return match[0]
        key = address_key(addr)
        if key in self.named:
            return self.aliaser.alias("address", self.named[key]).encode() + tail
        if not private_ip(addr):
            return match[0]
        return self.aliaser.alias("address", key).encode() + tail

    def _mac(self, match: re.Match[bytes]) -> bytes:
        if not private_mac(match[0]):
            return match[0]
        return self.aliaser.alias("mac", match[0].decode().lower()).encode()


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def discovered_hostnames(ledger: Ledger) -> frozenset[str]:
    """The hosts' own names as Gate A found them (each host-facts file's `hostname`): tools on
    the hosts print them (iperf3, for one) though no input names them."""
    names = set()
    for path in ledger.root.glob("discover/*/host-facts-*.json"):
        try:
            name = json.loads(path.read_text()).get("hostname")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(name, str) and 1 < len(name) <= 253 and not _is_ip(name):
            names.add(name)
    return frozenset(names)


def export(ledger: Ledger, inputs: Inputs, out: Path) -> dict[str, Any]:
    """Write the scrubbed record to out (which must not exist); return the manifest."""
    if out.exists():
        raise FileExistsError(f"{out} exists; choose a fresh export path")
    alias_path = ledger.root / ALIAS_FILE
    stored = json.loads(alias_path.read_text()) if alias_path.exists() else {}
    aliaser = Aliaser(stored)
    scrub = Scrubber(inputs, aliaser, discovered_hostnames(ledger), ledger.runs)
    writer = EvidenceWriter(Redactor(inputs.secrets()))
    private_dir(out)
    files: dict[str, Any] = {}
    for path in sorted(p for p in ledger.root.rglob("*") if p.is_file()):
        rel = path.relative_to(ledger.root)
        if rel.name in SKIP or rel.name.startswith("."):
            continue
        before = Counter(aliaser.counts)
        private_dir(out / rel.parent)
        written = writer.create(out / rel, scrub(path.read_bytes()))
        changed = aliaser.counts - before
        files[str(rel)] = {"sha256": sha256_bytes(written),
                           "replaced": {f"{k}:{a}": n for (k, a), n in sorted(changed.items())}}
    manifest = stamp("narwhal.export-manifest", 1, {
        "deployment": ledger.deployment, "exported": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "aliases": {kind: sorted(table.values()) for kind, table in aliaser.map.items()},
        "totals": {f"{k}:{a}": n for (k, a), n in sorted(aliaser.counts.items())},
        "files": files,
    })
    writer.create_json(out / "export-manifest.json", manifest)
    writer.replace_json(alias_path, aliaser.map)
    return manifest
