"""Small helpers shared by every console script: exit codes and the 'not built yet' notice."""

from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_BUILT = 3


def not_built(command: str, what: str) -> int:
    """Say plainly that a command exists but its capability is not built yet."""
    print(f"{command}: {what}", file=sys.stderr)
    print(f"{command}: not built yet in this revision; see the project's open issues", file=sys.stderr)
    return EXIT_NOT_BUILT
