"""The full source revision of the Narwhal that ran a gate (git HEAD and whether it was dirty)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import narwhal


@cache
def source_revision() -> dict[str, object]:
    root = Path(narwhal.__file__).resolve().parents[2]
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  check=False, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.decode().strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if head else None
    return {"package_version": narwhal.__version__, "git_commit": head, "dirty": dirty}
