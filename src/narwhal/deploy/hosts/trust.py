"""First contact with a host: scan its keys, show fingerprints, pin them in known_hosts."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

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


def pinned_fingerprints(known_hosts: Path, dest: Destination) -> list[str]:
    return [_fingerprint(line)[0] for line in pinned_lines(known_hosts, dest)]
