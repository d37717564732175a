"""Write runtime.lock: every runtime dependency of narwhal-fleet pinned, with its wheel's sha256.

`narwhal install` ships these wheels to hosts that have no package index and installs them
with hash checking on, so the lock names one wheel per package for the hosts' platform
(CPython 3.11, manylinux x86_64, as Gate A requires). Run it after changing a dependency
pin in pyproject.toml; it needs a package index.

    .venv/bin/python scripts/lock_runtime.py
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = """\
# The runtime wheelhouse of narwhal-fleet: every runtime dependency pinned, with the sha256
# of its wheel for the hosts' platform. Written by scripts/lock_runtime.py; do not edit.
# python: cp311
# platform: manylinux_x86_64
"""


def main() -> int:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                        "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
                        "--platform", "manylinux_2_28_x86_64", "--implementation", "cp",
                        "-d", tmp, *pins], check=True)
        lines = []
        for wheel in sorted(Path(tmp).glob("*.whl"), key=lambda p: p.name.lower()):
            name, version = wheel.name.split("-")[:2]
            sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
            lines.append(f"{name.lower()}=={version} --hash=sha256:{sha}  # {wheel.name}")
    (ROOT / "runtime.lock").write_text(HEADER + "\n".join(lines) + "\n")
    print(f"runtime.lock: {len(lines)} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
