"""What shapes the compiled router build, in one place.

    python3 scripts/build_stamp.py [--pure]     prints the stamp scripts/setup-venv.sh writes

compiled-modules.txt names the modules mypyc compiles, as paths under src/narwhal/serve
without .py (router/request/call is narwhal.serve.router.request.call). setup.py compiles them,
scripts/setup-venv.sh stamps each build with `stamp()` and rebuilds when it changes, and
tests/conftest.py refuses a test session whose sources no longer match the stamp.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compiled_names(root: Path = ROOT) -> list[str]:
    """The modules compiled-modules.txt names, in its order: paths under src/narwhal/serve,
    without .py."""
    listing = (root / "compiled-modules.txt").read_text()
    return [ln.strip() for ln in listing.splitlines() if ln.strip() and not ln.startswith("#")]


def compiled_sources(root: Path = ROOT) -> list[Path]:
    """Each listed module's source; a name with no source stops the build, never skipped."""
    sources = [root / "src" / "narwhal" / "serve" / f"{name}.py" for name in compiled_names(root)]
    missing = [str(path.relative_to(root)) for path in sources if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"compiled-modules.txt names modules with no source: {missing}")
    return sources


def stamp(pure: bool, root: Path = ROOT) -> str:
    """A digest of every input of the build, and whether it compiled."""
    digest = hashlib.sha256()
    for path in [root / "pyproject.toml", root / "setup.py", root / "compiled-modules.txt",
                 *compiled_sources(root)]:
        digest.update(path.read_bytes())
    return f"{digest.hexdigest()}-pure={int(pure)}"


if __name__ == "__main__":
    print(stamp("--pure" in sys.argv[1:]))
