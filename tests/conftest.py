"""Every tier runs against the router as it is built: the mypyc-compiled request path.

setup.py compiles the modules it names into extension modules beside their sources, and Python
imports an extension module before a source of the same name. A source edited after the last
build would therefore be tested (and served) as its old compiled self. scripts/setup-venv.sh
stamps each build with a digest of what shaped it; when the sources no longer match that
stamp, or the compiled files are not what the stamp says was built, the session stops before
it starts and says how to rebuild.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAMP = ROOT / ".venv" / ".narwhal-deps"
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _build_stamp() -> ModuleType:
    """scripts/build_stamp.py, the one place that knows what shapes the build."""
    spec = importlib.util.spec_from_file_location("build_stamp", ROOT / "scripts" / "build_stamp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_problems() -> list[str]:
    """What is wrong with the build in src/, one line each (empty when it matches)."""
    if not STAMP.exists():
        return ["no build stamp in .venv"]
    build = _build_stamp()
    stamped = STAMP.read_text().strip()
    pure = stamped.endswith("-pure=1")
    problems = []
    if stamped != build.stamp(pure):
        problems.append("a compiled module, compiled-modules.txt, setup.py or pyproject.toml "
                        "changed after the build")
    for source in build.compiled_sources():
        built = source.with_suffix(SUFFIX).exists()
        if pure and built:
            problems.append(f"{source.with_suffix(SUFFIX).relative_to(ROOT)} exists in a "
                            "NARWHAL_PURE_PYTHON=1 build")
        elif not pure and not built:
            problems.append(f"{source.relative_to(ROOT)} is not compiled")
    return problems


def pytest_sessionstart(session: pytest.Session) -> None:
    problems = build_problems()
    if problems:
        pytest.exit("the router's build does not match its sources:\n  " + "\n  ".join(problems)
                    + "\nrun `make setup` to rebuild it (scripts/setup-venv.sh)", returncode=4)


_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Wall time per test module (setup, call and teardown), for the summary below."""
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The slowest modules and each tier's total: `make test` must stay under 30 minutes here,
    so a new drill shows where its time goes and what it costs its tier."""
    if not _MODULE_SECONDS:
        return
    tiers: dict[str, float] = {}
    for module, seconds in _MODULE_SECONDS.items():
        tier = module.split("/")[1] if module.startswith("tests/") else module
        tiers[tier] = tiers.get(tier, 0.0) + seconds
    terminalreporter.write_sep("=", "time per tier and the slowest modules")
    for tier, seconds in sorted(tiers.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  tier {tier}")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:12]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {module}")
