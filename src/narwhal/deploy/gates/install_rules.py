"""Gate B's resume rule, on plain data: what an interrupted or repeated install keeps and what
it does again.

A rerun after any cut picks up where the host is, and a repeated install of the same prepared
run changes nothing: a file already at its target with the manifest's sha256 is kept, one
with other content is refused and left as it is (never overwritten: it may be an operator's);
a checkout is cloned only when none is there, and used only when it is a clean tree at the
revision; pip runs only while the venv's stamp does not name these requirements; a marker is
written only when it does not already say what it should. The outcome is "verified" only when
nothing had to be done. The relay (install_relay.py) follows the same file rule: which host
pulls which files from which, and what a pull's lines say. install.py reads the host and
acts; this module only decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

FileAction = Literal["send", "keep", "refuse"]


def file_action(present_sha256: str | None, want_sha256: str) -> FileAction:
    """A target file: sent when absent, kept when it already holds what is wanted, refused
    (and left as it is) when it holds anything else."""
    if present_sha256 is None:
        return "send"
    return "keep" if present_sha256 == want_sha256 else "refuse"


def checkout_refusal(head: str, changed: str, revision: str) -> str | None:
    """Why the checkout cannot be used (None when it is a clean tree at the revision)."""
    if head != revision or changed != "0":
        return f"is at {head} with {changed} changed path(s), not a clean {revision}"
    return None


def pip_needed(venv_stamp: str, requirements_sha256: str | None) -> bool:
    """pip runs unless the venv's completion stamp names exactly these requirements (a cut
    pip leaves no stamp, so it runs again)."""
    return venv_stamp != requirements_sha256


def marker_stale(read_ok: bool, text: str, want: str) -> bool:
    """A marker file (installed, current) is written unless it already says `want`."""
    return not (read_ok and text.strip() == want)


def install_outcome(installed_was_current: bool, pip_ran: bool, files_sent: int) -> tuple[str, str]:
    """(what the progress line says, the recorded outcome): "verified" when the host already
    held this revision and its venv; the record also needs no file to have been sent."""
    said = "verified" if installed_was_current and not pip_ran else "installed"
    recorded = "verified" if installed_was_current and not pip_ran and not files_sent \
        else "installed"
    return said, recorded


# --- the relay: hosts pass the shared files down a tree -----------------------------------

RELAY_FANOUT = 4  # hosts one relaying host serves: the tree is log_4(n) levels deep
RELAY_MIN_BYTES = 64 * 1024  # smaller files cost less sent over SSH than a pull's round trip
RelayStatus = Literal["created", "kept", "refused", "failed", "missing"]


@dataclass(frozen=True)
class RelayLine:
    """One file's line from the relay fetch (hosts/relay_scripts.py RELAY_FETCH)."""

    status: RelayStatus
    detail: str  # the new file's inode ("created"), why ("failed"), "-" otherwise
    path: str  # under the install directory


def relay_parents(aliases: Sequence[str], fanout: int = RELAY_FANOUT) -> dict[str, str | None]:
    """Each host's parent in the relay tree (None: the workstation sends to it): a `fanout`-ary
    tree in the hosts' order, so every parent comes before its children. The workstation sends
    the shared files once, to the first host, whatever the fleet's size."""
    return {a: (aliases[(i - 1) // fanout] if i else None) for i, a in enumerate(aliases)}


def relayed_files(child: Sequence[tuple[str, str | None, int]],
                  parent_digests: set[str]) -> list[tuple[str, str, int]]:
    """The (path, sha256, size) files a host pulls from its parent: those its parent also
    receives (same digest) and large enough to be worth a pull; secrets (no digest) never."""
    return [(path, digest, size) for path, digest, size in child
            if digest is not None and digest in parent_digests and size >= RELAY_MIN_BYTES]


def relay_lines(text: str, asked: set[str]) -> dict[str, RelayLine]:
    """The fetch's lines by path, for paths that were asked only; a path with no line (a cut
    fetch) is absent, so the workstation sends that file itself."""
    out: dict[str, RelayLine] = {}
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] in ("created", "kept", "refused", "failed", "missing") \
                and parts[2] in asked and (parts[0] != "created" or parts[1].isdigit()):
            status: RelayStatus = parts[0]  # type: ignore[assignment]
            out[parts[2]] = RelayLine(status, parts[1], parts[2])
    return out
