"""Running system commands for the lab: argv lists only, failures raised with their stderr."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from narwhal.core.errors import NarwhalError


class LabError(NarwhalError):
    """The lab could not be built, changed or torn down as asked."""


def run(argv: Sequence[str], *, check: bool = True, input_text: str | None = None,
        timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run argv and capture its output; raise LabError naming the command when it fails."""
    try:
        done = subprocess.run(list(argv), input=input_text, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except FileNotFoundError:
        raise LabError(f"{argv[0]} is not installed; see scripts/apt-packages.txt") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
    return done


def in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv]
