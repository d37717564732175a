"""Every tier runs against the router as it is built: the mypyc-compiled request path.

setup.py compiles the modules it names into extension modules beside their sources, and Python
imports an extension module before a source of the same name. A source edited after the last
build would therefore be tested (and served) as its old compiled self. scripts/setup-venv.sh
stamps each build with a digest of what shaped it; when the sources no longer match that
stamp, or the compiled files are not what the stamp says was built, the session stops before
it starts and says how to rebuild.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "src" / "narwhal" / "serve"
STAMP = ROOT / ".venv" / ".narwhal-deps"
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def compiled_names() -> list[str]:
    """The modules setup.py compiles (compiled-modules.txt), in its order."""
    listing = (ROOT / "compiled-modules.txt").read_text()
    return [ln.strip() for ln in listing.splitlines() if ln.strip() and not ln.startswith("#")]


def build_problems() -> list[str]:
    """What is wrong with the build in src/, one line each (empty when it matches)."""
    if not STAMP.exists():
        return ["no build stamp in .venv"]
    names = compiled_names()
    digest = hashlib.sha256()
    for path in [ROOT / "pyproject.toml", ROOT / "setup.py", ROOT / "compiled-modules.txt",
                 *(SERVE / f"{n}.py" for n in names)]:
        digest.update(path.read_bytes())
    stamped, _, pure = STAMP.read_text().strip().partition("-pure=")
    problems = []
    if stamped != digest.hexdigest():
        problems.append("a compiled module, compiled-modules.txt, setup.py or pyproject.toml "
                        "changed after the build")
    for name in names:
        built = (SERVE / f"{name}{SUFFIX}").exists()
        if pure == "1" and built:
            problems.append(f"{name}{SUFFIX} exists in a NARWHAL_PURE_PYTHON=1 build")
        elif pure != "1" and not built:
            problems.append(f"src/narwhal/serve/{name}.py is not compiled")
    return problems


def pytest_sessionstart(session: pytest.Session) -> None:
    problems = build_problems()
    if problems:
        pytest.exit("the router's build does not match its sources:\n  " + "\n  ".join(problems)
                    + "\nrun `make setup` to rebuild it (scripts/setup-venv.sh)", returncode=4)
