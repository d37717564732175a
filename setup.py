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

Build time matters: `narwhal install` builds the router's wheel once per revision from a clean
clone, inside Gate B. Two things keep that short. A pip build asks setup.py for its
requirements and metadata before it builds, and mypyc's translation (about 9 s) is needed only
for the build, so those calls skip it. The C compile (about 30 s) goes through ccache when the
machine has it (scripts/apt-packages.txt): the same modules give the same C, so a revision the
workstation's own `make setup` already compiled costs no compile at all. The working
directory is left out of ccache's key (the clone's folder is a fresh temporary one each time).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from build_stamp import ROOT, compiled_sources  # scripts/ is not a package: found through sys.path


METADATA_COMMANDS = {"egg_info", "dist_info"}


def _metadata_only() -> bool:
    """Is setup.py asked for requirements or metadata only (PEP 517's first calls)?"""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    return command in METADATA_COMMANDS


def _compile_through_ccache() -> None:
    """Route the C compiler through ccache when it is installed and CC is not chosen."""
    cc = sysconfig.get_config_var("CC")
    if "CC" in os.environ or not cc or shutil.which("ccache") is None:
        return
    os.environ["CC"] = f"ccache {cc}"
    os.environ.setdefault("CCACHE_NOHASHDIR", "1")


def _ext_modules() -> list[object]:
    if os.environ.get("NARWHAL_PURE_PYTHON") == "1" or _metadata_only():
        return []
    _compile_through_ccache()
    from mypyc.build import mypycify

    # Paths under src/: mypy names each module by its packages (narwhal.serve.router.request.call).
    paths = [str(path.relative_to(ROOT)) for path in compiled_sources()]
    return list(mypycify(paths, opt_level="3"))


setup(ext_modules=_ext_modules())
