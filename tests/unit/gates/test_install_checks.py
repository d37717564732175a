"""Gate B's check of each host's Python (from Gate A's facts) against the wheelhouse's lock."""

from __future__ import annotations

from narwhal.deploy.gates.install import python_problems
from narwhal.deploy.package.lock import parse_lock

LOCK = parse_lock("# python: cp311\n# platform: manylinux_x86_64\n"
                  "rich==15.0.0 --hash=sha256:" + "a" * 64 + "\n")


def _facts(version: str | None, venv: bool = True) -> dict[str, object]:
    return {"python": {"executable": "/usr/bin/python3", "version": version, "has_venv": venv}}


def test_the_locks_python_with_venv_passes() -> None:
    assert python_problems({"node-1": _facts("3.11.2")}, LOCK) == []


def test_another_python_or_no_venv_is_named_per_host_with_a_fix() -> None:
    problems = python_problems({"node-1": _facts("3.12.4"), "node-2": _facts("3.11.9", False),
                                "router": _facts(None)}, LOCK)
    lines = [p.line() for p in problems]
    assert len(lines) == 3
    assert lines[0].startswith("node-1: python3: Python 3.12.4") and "cp311" in lines[0]
    assert lines[1].startswith("node-2: python3: the venv module is missing")
    assert lines[2].startswith("router: python3: Python missing")
    assert all("narwhal discover" in line for line in lines)
