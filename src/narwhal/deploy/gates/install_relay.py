"""Gate B's relay: the workstation sends the shared files (the bundle, the wheels) to the
first host only, and every host pulls them from its parent in a tree (install_rules
`relay_parents`), so the workstation's bytes do not grow with the fleet.

A parent serves (hosts/relay_scripts.py RELAY_SERVE, started through the attempt like any
process a gate starts) once its own files are in place, while it
goes on to clone and install; a child waits for that, pulls over HTTP from the address its
parent's SSH destination names, checks each file's size and sha256 on arrival and links it in
place without replacing anything. The relay is only a shortcut: whatever a child could not
pull (its parent failed, cannot be reached at that address, or is slow past the deadline) the
workstation sends it over SSH as before, so an install never depends on it. Secrets are never
relayed; the relayed files are the prepared run's non-secret inputs, already hash-pinned in
its manifest. The servers are stopped when the gate ends, and end themselves when idle.
"""

from __future__ import annotations

import ipaddress
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from narwhal.core.errors import HostError
from narwhal.deploy.gates.install_rules import (
    RelayLine,
    relay_lines,
    relay_parents,
    relayed_files,
)
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host, ProcessRef
from narwhal.deploy.ledger.attempt import Attempt
from narwhal.deploy.package import prepared as prep

IDLE_S = 120.0  # a server with no request for this long ends itself
MAX_S = 1800.0  # and every server ends after this, whatever happens to the workstation
READ_TIMEOUT_S = 30.0  # one read from a parent; a slower one sends the rest over SSH
PULL_DEADLINE_S = 600.0  # all of one host's pulls
WAIT_S = 1800.0  # for a parent to serve or give up (it always does one, in `release`)
LOG = ".relay-serve.log"


PORT_WAIT_S = 5.0  # for a started server to say its port
Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class Serving:
    host: Host
    url: str
    process: ProcessRef  # started through the attempt, so `recover install` also ends it


def url_host(address: str) -> str:
    """An address as a URL's host part (an IPv6 literal in brackets)."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address  # a name


class RelayTree:
    """Who pulls from whom in one Gate B run, and each parent's URL once it serves.

    Every host's `release` is called when its install ends (install.execute), so no child
    waits on a parent that failed before serving."""

    def __init__(self, packages: Sequence[prep.HostPackage], addresses: dict[str, str]):
        self.parents = relay_parents([p.alias for p in packages])
        by_alias = {p.alias: p for p in packages}
        sizes = {f.local: f.local.stat().st_size for p in packages for f in p.files if f.local}
        # (path, sha256, size) of the files each host pulls from its parent, decided once
        self.pulls: dict[str, list[tuple[str, str, int]]] = {
            alias: relayed_files([(f.remote, f.sha256, sizes[f.local] if f.local else 0)
                                  for f in by_alias[alias].files],
                                 {f.sha256 for f in by_alias[parent].files if f.sha256})
            if parent is not None else [] for alias, parent in self.parents.items()}
        self._own = {alias: {f.sha256: f.remote for f in p.files if f.sha256}
                     for alias, p in by_alias.items()}
        self._addresses = addresses
        self._ready = {p.alias: threading.Event() for p in packages}
        self._urls: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self.serving: list[Serving] = []

    def serves(self, alias: str) -> list[tuple[str, str]]:
        """(sha256, path) of every file a child of `alias` pulls from it."""
        wanted = {digest for child, parent in self.parents.items() if parent == alias
                  for _, digest, _ in self.pulls[child]}
        own = self._own[alias]
        return sorted((d, own[d]) for d in wanted if d in own)

    def parent_url(self, alias: str) -> tuple[str | None, str | None]:
        """(the parent, the URL it serves at), waiting until it serves or gives up (None)."""
        parent = self.parents[alias]
        if parent is None or not self._ready[parent].wait(WAIT_S):
            return parent, None
        return parent, self._urls.get(parent)

    def serve(self, host: Host, attempt: Attempt, base: str) -> None:
        """Start serving what this host's children pull (none: nothing is started). A server
        that cannot start or never says its port leaves the children to the workstation."""
        files = self.serves(host.alias)
        address = self._addresses.get(host.alias)
        if not files or address is None:
            return
        token = secrets.token_hex(16)
        log = f"{base}/{LOG}"
        try:
            ref = attempt.start_process(host, cl.relay_server(address, token, IDLE_S, MAX_S,
                                                              base, files), log)
        except HostError:
            return
        port = _port(host, log)
        if port is None:
            _end(host, ref)
            return
        url = f"http://{url_host(address)}:{port}/{token}"
        with self._lock:
            self.serving.append(Serving(host, url, ref))
            self._urls[host.alias] = url
        self._ready[host.alias].set()

    def release(self, alias: str) -> None:
        """This host serves no more children than it already does: wake any that wait."""
        self._ready[alias].set()

    def stop(self) -> None:
        """End every server this run started, by pid and start time (never a reused pid)."""
        for s in self.serving:
            _end(s.host, s.process)


def _end(host: Host, ref: ProcessRef) -> None:
    """Signal a server this run started while its pid is still that process."""
    if host.process_start(ref.pid) == ref.start_ticks:
        host.signal(ref.pid)


def _port(host: Host, log: str) -> int | None:
    """The port a relay server's log says it listens on (`port <n>`, its first line)."""
    deadline = time.monotonic() + PORT_WAIT_S
    while time.monotonic() < deadline:
        said = host.run(cl.read_head(log, 64)).text.split()
        if len(said) >= 2 and said[0] == "port" and said[1].isdigit():
            return int(said[1])
        time.sleep(0.05)
    return None


def pull(tree: RelayTree, host: Host, attempt: Attempt, base: str, pkg: prep.HostPackage,
         progress: Progress) -> tuple[set[str], int]:
    """Pull this host's shared files from its parent: (the paths now in place, how many were
    created). Files already there are checked first, without waiting for the parent, so a
    rerun never waits on another host. A different file at a target is refused, as the
    workstation's send refuses it."""
    wanted = tree.pulls[pkg.alias]
    if not wanted:
        return set(), 0
    lines = _fetch(host, "-", base, wanted)
    done = {path for path, line in lines.items() if line.status == "kept"}
    missing = [w for w in wanted if w[0] in lines and lines[w[0]].status == "missing"]
    if not missing:
        return done, 0
    parent, url = tree.parent_url(pkg.alias)
    if url is None:
        progress(host.alias, f"{parent} does not relay: the workstation sends its files")
        return done, 0
    progress(host.alias, f"pulling {len(missing)} files from {parent}")
    created = 0
    digests = {path: digest for path, digest, _ in missing}
    for path, line in _fetch(host, url, base, missing).items():
        if line.status == "created":
            attempt.own_file(host, f"{base}/{path}", int(line.detail), digests[path])
            created += 1
        if line.status in ("created", "kept"):
            done.add(path)
    return done, created


def _fetch(host: Host, url: str, base: str,
           files: list[tuple[str, str, int]]) -> dict[str, RelayLine]:
    """One RELAY_FETCH run's lines by path; any `refused` ends the install, naming the file."""
    listing = "".join(f"{digest} {size} {path}\n" for path, digest, size in files)
    got = host.run(cl.relay_fetch(url, base, READ_TIMEOUT_S, PULL_DEADLINE_S),
                   stdin=listing.encode(), timeout=PULL_DEADLINE_S + 60)
    lines = relay_lines(got.text, {path for path, _, _ in files})
    for path, line in lines.items():
        if line.status == "refused":
            raise HostError(host.alias, f"{base}/{path} already exists with other content; "
                            "it was left as it is: move it away, or prepare a new run")
    return lines
