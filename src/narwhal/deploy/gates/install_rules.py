"""Gate B's resume rule, on plain data: what an interrupted or repeated install keeps and what
it does again.

A rerun after any cut picks up where the host is, and a repeated install of the same prepared
run changes nothing: a file already at its target with the manifest's sha256 is kept, one
with other content is refused and left as it is (never overwritten: it may be an operator's);
a checkout is cloned only when none is there, and used only when it is a clean tree at the
revision; pip runs only while the venv's stamp does not name these requirements; a marker is
written only when it does not already say what it should. The outcome is "verified" only when
nothing had to be done. install.py reads the host and acts; this module only decides.
"""

from __future__ import annotations

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
