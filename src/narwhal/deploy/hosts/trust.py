"""First contact with a host: scan its keys, show fingerprints, pin them in known_hosts."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core.documents import stamp
from narwhal.core.errors import HostUnreachable
from narwhal.deploy.inputs.destination import Destination

KEY_TYPES = "ed25519,ecdsa,rsa"


@dataclass(frozen=True)
class ScannedKey:
    line: str          # known_hosts line: "<host> <type> <base64>"
    fingerprint: str   # "SHA256:..."
    key_type: str


def known_hosts_name(dest: Destination) -> str:
    return f"[{dest.host}]:{dest.port}" if dest.port and dest.port != 22 else dest.host


def _fingerprint(line: str) -> tuple[str, str]:
    done = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", "-"], input=line.encode(),
                          capture_output=True, check=False)
    parts = done.stdout.decode().split()
    if done.returncode != 0 or len(parts) < 2:
        return "unreadable", "?"
    return parts[1], parts[-1].strip("()")


def scan(dest: Destination, timeout: int, alias: str = "host") -> list[ScannedKey]:
    """Ask the host for its public keys (ssh-keyscan); empty or failed scan is an error."""
    argv = ["ssh-keyscan", "-T", str(timeout), "-t", KEY_TYPES]
    if dest.port:
        argv += ["-p", str(dest.port)]
    done = subprocess.run([*argv, dest.host], capture_output=True, check=False,
                          timeout=timeout + 10)
    keys = []
    for raw in done.stdout.decode().splitlines():
        if not raw or raw.startswith("#"):
            continue
        _host, key_type, blob = raw.split()[:3]
        line = f"{known_hosts_name(dest)} {key_type} {blob}"
        fingerprint, _ = _fingerprint(line)
        keys.append(ScannedKey(line, fingerprint, key_type))
    if not keys:
        raise HostUnreachable(alias, f"no host key answered within {timeout} s; check the "
                              "route and port")
    return keys


def scan_fingerprints(dest: Destination, timeout: int) -> list[str]:
    try:
        return [k.fingerprint for k in scan(dest, timeout)]
    except (HostUnreachable, subprocess.TimeoutExpired):
        return []


def pinned_lines(known_hosts: Path, dest: Destination) -> list[str]:
    if not known_hosts.exists():
        return []
    name = known_hosts_name(dest)
    return [ln for ln in known_hosts.read_text().splitlines() if ln.split(" ", 1)[0] == name]


def pinned_keys(known_hosts: Path, dest: Destination) -> list[ScannedKey]:
    """The keys pinned for dest, in the form a scan reports them (line, fingerprint, type)."""
    return [ScannedKey(line, _fingerprint(line)[0], [*line.split(), "?", "?"][1])
            for line in pinned_lines(known_hosts, dest)]


def pinned_fingerprints(known_hosts: Path, dest: Destination) -> list[str]:
    return [key.fingerprint for key in pinned_keys(known_hosts, dest)]


def trust_action(pinned: Sequence[str], presented: Sequence[str], replace: bool) -> str:
    """What `narwhal hosts trust` does with one host, from the fingerprints pinned for it, those
    it presents now, and whether the operator named it in --replace:

    "pin" (nothing pinned yet), "replace" (named in --replace: its pinned keys give way to the
    presented ones), "kept" (a presented key is already pinned), "changed" (no presented key is
    pinned: refused until the new key is verified and the host named in --replace)."""
    if not pinned:
        return "pin"
    if replace:
        return "replace"
    if set(pinned) & set(presented):
        return "kept"
    return "changed"


# What a `hosts trust` run did with a host whose key was confirmed, by trust_action.
CONFIRMED = {"pin": "pinned", "replace": "replaced"}
TRUST_SCHEMA = "narwhal.host-trust"


@dataclass
class HostTrust:
    """One host in a `narwhal hosts trust` run: the keys pinned for it before, the keys it
    presents, what trust_action decided and what came of it (`outcome`): pinned, replaced,
    kept, declined (the operator said no), unconfirmed (no one could be asked) or refused
    (its key changed and it was not named in --replace)."""

    alias: str
    roles: list[str]
    previous: list[ScannedKey]
    presented: list[ScannedKey]
    action: str
    outcome: str = ""

    @property
    def pinned(self) -> list[ScannedKey]:
        """The keys known_hosts holds for this host once the run is over."""
        return self.presented if self.outcome in CONFIRMED.values() else self.previous

    def as_json(self) -> dict[str, object]:
        def keys(found: list[ScannedKey]) -> list[dict[str, str]]:
            return [{"key_type": k.key_type, "fingerprint": k.fingerprint} for k in found]

        return {"alias": self.alias, "roles": self.roles, "action": self.action,
                "outcome": self.outcome or "not reached", "pinned": keys(self.pinned),
                "previous": keys(self.previous), "presented": keys(self.presented)}


def known_hosts_after(lines: Sequence[str], hosts: Sequence[HostTrust]) -> list[str]:
    """known_hosts once the run is applied: a replaced host's old lines go (only when its new
    key was confirmed: a declined replacement keeps the old pin), confirmed keys are added."""
    dropped = {k.line for h in hosts if h.outcome == "replaced" for k in h.previous}
    added = [k.line for h in hosts if h.outcome in CONFIRMED.values() for k in h.presented]
    return [line for line in lines if line not in dropped] + added


def trust_record(known_hosts: Path, hosts: Sequence[HostTrust]) -> dict[str, Any]:
    """The `trust` activity's evidence: per host alias, the key fingerprints pinned, and for a
    replacement the old ones beside the new, which a later "host key changed" is judged by."""
    return stamp(TRUST_SCHEMA, 1, {"known_hosts": str(known_hosts),
                                   "hosts": [h.as_json() for h in hosts]})
