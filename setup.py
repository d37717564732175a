"""Compiles the router's request path with mypyc; everything else is in pyproject.toml.

The modules listed in compiled-modules.txt run once or more per request in narwhal-serve
(front, legs, relay, call, placement, health, deadlines, metrics, the journal's queue).
Compiled, they cost about half the CPU per request of the same code interpreted
(bench/hot_path.py), which is most of what separated the router from the bare I/O floor in
bench/router_overhead.py. The code stays ordinary typed Python: it runs unchanged when
interpreted, and mypy --strict already holds it to the types mypyc relies on. pricing.py stays
interpreted: mypyc cannot compile its generic dataclasses.

NARWHAL_PURE_PYTHON=1 installs without compiling (a machine without a C compiler). An edited
module is recompiled by `make setup` (scripts/setup-venv.sh); until then tests refuse to run
against the stale build (tests/conftest.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from build_stamp import compiled_names  # scripts/ is not a package: found through sys.path


def _ext_modules() -> list[object]:
    if os.environ.get("NARWHAL_PURE_PYTHON") == "1":
        return []
    from mypyc.build import mypycify

    paths = [f"src/narwhal/serve/{name}.py" for name in compiled_names()]
    return list(mypycify(paths, opt_level="3"))


setup(ext_modules=_ext_modules())
