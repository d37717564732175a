"""Staging on the engine hosts: each host downloads its files from the hub at the pinned commit;
a host that cannot reach the hub gets them from a host that has them, through the workstation.

How bytes flow: the hub sends each missing file once to every host that can reach it (each
host needs its own copy, and a host's own download is the shortest path); the workstation
sends the stage kit (once per host and kit, kept there for later runs) and, for a host with no
route to the hub, forwards each file it lacks from a host that staged it, a bounded piece at a
time, checked against the hub's sha256 before it is moved into place. Nothing is sent for a
file a host already holds at the right sha256.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.core import result_line
from narwhal.core.documents import sha256_bytes
from narwhal.core.errors import HostError
from narwhal.core.secret import Secret
from narwhal.deploy.checkpoint import manifest as mf
from narwhal.deploy.checkpoint.kit import Kit
from narwhal.deploy.gates.parallel import each
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.ledger.attempt import Attempt

STAGE_FILE = Path(__file__).resolve().parents[2] / "node" / "stage_checkpoint.py"
STAGE_COMMAND = "narwhal-stage-checkpoint"
KIT_ROOT = "Narwhal-deploy/hub-kit"  # under the login's home, beside Gate B's installs
KIT_COMPLETE = "site/.narwhal-kit-complete"
KIT_ARCHIVE = "kit.zip"
STAGE_TIMEOUT_S = 6 * 3600.0  # hours of transfer on a real fleet; the hub client resumes
RELAY_PIECE = 16 << 20  # bytes per relayed read: bounded memory on the workstation
Progress = Callable[[str, str], None]


@dataclass
class Staged:
    """What staging did on one host, and the bytes it moved."""

    host: str
    outcome: str  # kept | staged | relayed | unreachable | failed
    files: dict[str, str] = field(default_factory=dict)  # path -> fetched | repaired | relayed
    hub_bytes: int = 0  # downloaded by the host from the hub
    kit_bytes: int = 0  # the stage kit, sent from the workstation
    relayed_bytes: int = 0  # forwarded by the workstation from another host
    donor: str | None = None
    error: str | None = None
    seconds: float = 0.0  # this host's staging, kit and relay included

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "outcome": self.outcome, "files": dict(sorted(
            self.files.items())), "hub_bytes": self.hub_bytes, "kit_bytes": self.kit_bytes,
            "relayed_bytes": self.relayed_bytes, "donor": self.donor, "error": self.error,
            "seconds": round(self.seconds, 3)}


def ensure_kit(host: Host, attempt: Attempt, kit: Kit, archive: Path) -> tuple[str, int]:
    """The kit's folder on host, its archive sent unless the kit is unpacked there already
    (or the archive is there whole); bytes sent."""
    kit_dir = f"{host.home()}/{KIT_ROOT}/{kit.digest[:16]}"
    if host.stat_file(f"{kit_dir}/{KIT_COMPLETE}") is not None:
        return kit_dir, 0
    parts = kit_dir.split("/")
    for depth in range(3, len(parts) + 1):
        folder = "/".join(parts[:depth])
        if host.stat_dir(folder) is None:
            attempt.make_dir(host, folder)
    data = archive.read_bytes()
    have = host.stat_file(f"{kit_dir}/{KIT_ARCHIVE}")
    if have is not None and have[1] == hashlib.sha256(data).hexdigest():
        return kit_dir, 0
    attempt.create_file(host, f"{kit_dir}/{KIT_ARCHIVE}", data)
    return kit_dir, len(data)


def request(manifest: mf.Manifest, fetch: mf.Fetch, model_dir: str, kit_dir: str,
            kit: Kit, token: Secret | None) -> bytes:
    """The host script's stdin: the token rides here into its environment, never argv."""
    doc = {"schema": "narwhal.stage-request", "schema_version": 1,
           "repo_id": manifest.repo_id, "commit": manifest.commit, "model_dir": model_dir,
           "endpoint": manifest.endpoint, "files": list(fetch.files),
           "repair": list(fetch.repair), "remove": list(fetch.remove), "kit": kit_dir,
           "wheels": [{"file": n, "sha256": s} for n, _, s in kit.wheels],
           "archive": KIT_ARCHIVE,
           "token": token.reveal() if token is not None else None}
    return json.dumps(doc).encode()


def download(host: Host, attempt: Attempt, manifest: mf.Manifest, fetch: mf.Fetch,
             model_dir: str, kit: tuple[Kit, Path], token: Secret | None) -> Staged:
    """Run the host script for one host's files; what it did."""
    kit_dir, kit_bytes = ensure_kit(host, attempt, *kit)
    code = STAGE_FILE.read_bytes()
    path = f"/tmp/narwhal-stage-{attempt.id}-{sha256_bytes(code)[:12]}.py"  # noqa: S108
    attempt.create_file(host, path, code)
    try:
        run = host.run(["python3", path], timeout=STAGE_TIMEOUT_S,
                       stdin=request(manifest, fetch, model_dir, kit_dir, kit[0], token))
    finally:
        host.run(["rm", "-f", "--", path])
    result = result_line.parse(run.text, STAGE_COMMAND)
    if not result.ok:
        return Staged(host.alias, "failed", kit_bytes=kit_bytes, error=result.error[:300])
    data = result.data
    files = {str(k): str(v) for k, v in (data.get("files") or {}).items()}
    sizes = manifest.by_path()
    got = sum(sizes[p].size for p in files if p in sizes)
    said = str(data.get("outcome"))
    outcome = said if said in ("staged", "unreachable") else "failed"
    error = data.get("error")
    if outcome == "failed" and data.get("file"):
        error = f"{data.get('file')}: {data.get('kind')}: {error}"
    return Staged(host.alias, outcome, files, got, kit_bytes,
                  error=str(error)[:300] if error else None)


Pieces = Callable[[mf.HubFile], Iterator[bytes]]  # one file's bytes, RELAY_PIECE at a time


def host_pieces(donor: Host, model_dir: str) -> Pieces:
    """A file read from a host that has it, a bounded range per command."""
    def read(want: mf.HubFile) -> Iterator[bytes]:
        sent, source = 0, f"{model_dir}/{want.path}"
        while sent < want.size:
            piece = donor.run(cl.read_range(source, sent, min(RELAY_PIECE, want.size - sent)),
                              timeout=600, check=True, keep_stdout=False).stdout
            if not piece:
                raise HostError(donor.alias, f"{source} ended at {sent} of {want.size} bytes")
            sent += len(piece)
            yield piece
    return read


def local_pieces(fetched: Callable[[str], Path]) -> Pieces:
    """A file of the pin on the workstation (its hub cache)."""
    def read(want: mf.HubFile) -> Iterator[bytes]:
        with fetched(want.path).open("rb") as f:
            yield from iter(lambda: f.read(RELAY_PIECE), b"")
    return read


def deliver(receiver: Host, pieces: Iterator[bytes], target: str, want: mf.HubFile) -> int:
    """Append the pieces to a part file; checked against the pin's sha256, then moved in."""
    part = f"{target}.narwhal-relay"
    receiver.run(["rm", "-f", "--", part], check=True)
    sent = 0
    for piece in pieces:
        receiver.run(cl.append_shared(part), stdin=piece, timeout=600, check=True)
        sent += len(piece)
    got = receiver.run(cl.sha256_file(part), check=True).text.split()[0]
    if got != want.sha256:
        receiver.run(["rm", "-f", "--", part])
        raise HostError(receiver.alias, f"{want.path} arrived with sha256 {got}, the revision "
                        f"has {want.sha256}")
    receiver.run(cl.move_into_place(part, target), check=True)
    return sent


def relay(sessions: Sessions, attempt: Attempt, manifest: mf.Manifest, fetch: mf.Fetch,
          dirs: dict[str, str], donor: str, fetched: Callable[[str], Path],
          staged: Staged) -> Staged:
    """Bring a host that cannot reach the hub the files it lacks (and retire the previous
    pin's dropped files): from `donor`, a host that has them, or from the workstation, which
    pinned the revision through the hub, when `donor` is "workstation" (no host has them)."""
    files = manifest.by_path()
    dst = sessions.get(fetch.host)
    hosts = [dst] if donor == "workstation" else [sessions.get(donor), dst]
    with attempt.bind(*hosts):
        pieces = local_pieces(fetched) if donor == "workstation" else \
            host_pieces(hosts[0], dirs[donor])
        for name in fetch.remove:
            dst.run(["rm", "-f", "--", f"{dirs[fetch.host]}/{name}"], check=True)
            staged.files[name] = "removed"
        for name in fetch.files:
            staged.relayed_bytes += deliver(dst, pieces(files[name]),
                                            f"{dirs[fetch.host]}/{name}", files[name])
            staged.files[name] = "relayed"
    staged.outcome, staged.donor = "relayed", donor
    return staged


def stage(sessions: Sessions, attempt: Attempt, manifest: mf.Manifest,
          fetches: Sequence[mf.Fetch], dirs: dict[str, str],
          kit: Callable[[], tuple[Kit, Path]],
          token: Secret | None, progress: Progress,
          fetched: Callable[[str], Path]) -> list[Staged]:
    """Every host's fetch at once; then the unreachable ones from a host that has it all, or
    from the workstation when none does (`fetched`: a file of the pin on the workstation)."""
    the_kit = kit()

    def one(fetch: mf.Fetch) -> Staged:
        progress(fetch.host, f"staging {len(fetch.files)} file(s) of "
                 f"{manifest.repo_id}@{manifest.commit[:12]}")
        host = sessions.get(fetch.host)
        started = time.monotonic()
        with attempt.bind(host):
            done = download(host, attempt, manifest, fetch, dirs[fetch.host], the_kit, token)
        done.seconds = time.monotonic() - started
        progress(fetch.host, f"{done.outcome} ({done.hub_bytes} bytes from the hub)")
        return done

    results: list[Staged] = []
    for outcome in each(list(fetches), one):
        if outcome.error is not None:
            if not isinstance(outcome.error, HostError):
                raise outcome.error
            results.append(Staged(outcome.item.host, "failed", error=str(outcome.error)[:300]))
        else:
            assert outcome.value is not None
            results.append(outcome.value)
    by_host = {f.host: f for f in fetches}
    donors = [h for h in dirs if h not in by_host] + [
        r.host for r in results if r.outcome == "staged"]
    for r in results:
        if r.outcome != "unreachable":
            continue
        donor = donors[0] if donors else "workstation"
        progress(r.host, f"no route to the hub: relaying from {donor}")
        started = time.monotonic()
        try:
            relay(sessions, attempt, manifest, by_host[r.host], dirs, donor, fetched, r)
        except (HostError, OSError) as exc:
            r.outcome, r.error = "failed", str(exc)[:300]
        r.seconds += time.monotonic() - started
    return results
