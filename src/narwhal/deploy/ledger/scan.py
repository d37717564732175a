"""What in a record's bytes is a private value, and how it is spelled: network addresses in
every textual form, hardware (MAC) addresses, and the workstation and host paths the inputs
name. `export.Scrubber` decides what each found value is replaced by; this module only finds
and judges, so the patterns can be tested on plain bytes.

Addresses are found by a loose pattern and then judged by `ipaddress`: a regex that spelled
out every compressed IPv6 form would be long and easy to get wrong, while a candidate that
`ipaddress` refuses (a timestamp `12:30:45`, a MAC, `std::vector`) is simply left as it was.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from pathlib import Path

from narwhal.deploy.inputs.model import Inputs

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

IPV4_RE = re.compile(rb"(?<![0-9.])(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?![0-9])")
# An IPv6 candidate: hex groups and colons (at least two), an optional dotted IPv4 tail and an
# optional zone id (`%eth0`, or `%25eth0` inside a URL), which belongs to the address. It does
# not start inside a word, but may follow `src:`, `=` or `[`; a run that is no address as a
# whole (a MAC, a timestamp) is consumed and left as it was, so no part of it is read alone.
IPV6_RE = re.compile(
    rb"(?<![0-9A-Za-z.%])"
    rb"(?=[0-9A-Fa-f]*:[0-9A-Fa-f]*:)[0-9A-Fa-f:.]*[0-9A-Fa-f:]"
    rb"(?:%[0-9A-Za-z_-]+(?:\.[0-9A-Za-z_-]+)*)?"
    rb"(?![0-9A-Za-z%])")
# EUI-48 (Ethernet) and 20-byte IPoIB link addresses as `ip` prints them; a run of colon-hex
# that is longer or shorter (an MD5 fingerprint, a timestamp) is not one.
MAC_RE = re.compile(rb"(?<![0-9A-Za-z:.-])(?:(?:[0-9A-Fa-f]{2}:){19}|(?:[0-9A-Fa-f]{2}:){5})"
                    rb"[0-9A-Fa-f]{2}(?![0-9A-Za-z:-])")
HOME_RE = re.compile(rb"/home/[A-Za-z0-9_.-]+|/root(?![A-Za-z0-9_-])")
# Top-level directories that are the same on every Linux host: they name nobody's layout, and
# aliasing `/tmp` or `/srv` would make every other path in the record unreadable. (Names
# compared against, never opened: hence the S108 waiver.)
COMMON_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/media",
                         "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys",
                         "/tmp", "/usr", "/var"})  # noqa: S108
START = rb"(?<![A-Za-z0-9_.~-])"  # not inside a name
NOT_AN_ADDRESS = re.compile(r"[0-9]{0,3}::[0-9]{0,3}")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
SHARED = ipaddress.ip_network("100.64.0.0/10")


def read_address(text: str) -> IPAddress | None:
    """The address text spells, or None. `::`, and `::` with at most three decimal digits on
    either side (`1::3`, `::2`), are read as not addresses, `::1` excepted: in a record they
    are Python slices (`a[1::3]`) and C++ scopes in a traceback, and no host has one."""
    if text != "::1" and NOT_AN_ADDRESS.fullmatch(text):
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def private_ip(addr: IPAddress) -> bool:
    """True for an address that says something about the operator's networks: private,
    loopback, link-local, reserved, multicast, unspecified or carrier-grade NAT. An IPv6 form
    that embeds an IPv4 address is judged by that address too, so `::ffff:8.8.8.8` reads as
    public and `2002:a00:5::1` (6to4 of 10.0.0.5) as private."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return private_ip(addr.ipv4_mapped)
        if addr in NAT64:
            return private_ip(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
        if addr.sixtofour is not None and private_ip(addr.sixtofour):
            return True
    return addr.is_private or addr.is_loopback or addr.is_link_local or addr.is_reserved \
        or addr.is_multicast or addr.is_unspecified or addr in SHARED


def address_key(addr: IPAddress) -> str:
    """The alias map's key for an address: its canonical text, so `FD00:0:0::1` and `fd00::1`
    share one alias, and an IPv4-mapped form shares its IPv4 address's alias (one host, one
    alias). A zone id stays in the key: `fe80::1%eth0` and `fe80::1%eth1` may be two hosts."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def private_mac(text: bytes) -> bool:
    """Every hardware address names one network card, and the link-local IPv6 addresses made
    from it (EUI-64) are aliased, so it is aliased too; only all-zero (loopback) and all-ones
    (broadcast) are the same everywhere and kept, so `ip` output still reads."""
    digits = set(text.replace(b":", b"").lower())
    return digits not in ({ord("0")}, {ord("f")})


def private_paths(inputs: Inputs, runs: Path | None) -> dict[str, str]:
    """Every spelling of every path the inputs name, mapped to the path it spells (so one
    folder has one alias), longest first (so the runs folder is replaced before the checkout
    that holds it): model and run dirs on the hosts, SSH keys, known_hosts, the checkout
    holding the `.env`, and the runs folder."""
    local: set[str | Path] = {inputs.source.parent}
    local |= {k for k in (inputs.ssh_key, inputs.known_hosts, inputs.router.ssh_key,
                          *(e.ssh_key for e in inputs.engines)) if k}
    if runs is not None:
        local.add(runs)
    found = {s: _trim(os.path.normpath(d)) for e in inputs.engines for d in (e.model_dir, e.run_dir)
             for s in (d, os.path.normpath(d))}
    for path in local:
        written = os.path.expanduser(str(path))
        # as written (ssh gets that), absolute, and with links resolved (the ledger's root)
        spelt = Path(written).resolve()
        found |= {s: _trim(str(spelt)) for s in (str(path), os.path.abspath(written), str(spelt))}
    kept = {_trim(s): p for s, p in found.items() if "/" in s}
    kept = {s: p for s, p in kept.items()
            if s not in COMMON_DIRS and not HOME_RE.fullmatch(s.encode())}
    return dict(sorted(kept.items(), key=lambda item: (-len(item[0]), item[0])))


def _trim(path: str) -> str:
    return path.rstrip("/") or "/"


def path_pattern(paths: Iterable[str]) -> re.Pattern[bytes] | None:
    """One pattern for every path, longest first. A path of two or more names is private
    wherever it occurs, also under another root (`/var/lib/docker/.../merged/srv/models/qwen`
    is the model dir seen through a container). A one-name path (`/models`) or a relative one
    (`keys/id`) must not start inside a name, or every `.../transformers/models/...` would be
    hit. A path ends where its last name ends, so a following `/config.json`, `:`, quote or
    full stop is kept. `/srv/models2` is another directory; `/srv/models-old` and
    `/srv/models.bak` are aliased as `<path-1>-old` and `<path-1>.bak`, better once too often
    than leaking the private part."""
    paths = list(paths)
    if not paths:
        return None
    body = b"|".join((b"" if p.startswith("/") and p.count("/") > 1 else START)
                     + re.escape(p.encode()) for p in paths)
    return re.compile(rb"(?:" + body + rb")(?![A-Za-z0-9_])")
