"""The folders are machine roles: imports flow only the permitted way."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "narwhal"
ALLOWED = {
    "core": {"core"},
    "deploy": {"core", "deploy"},
    "node": {"core", "node"},
    "serve": {"core", "serve"},
    "lab": {"core", "node", "serve", "lab"},
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("narwhal."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("narwhal.")}
    return found


def test_import_direction_follows_machine_roles() -> None:
    wrong = []
    for role, allowed in ALLOWED.items():
        for path in (SRC / role).rglob("*.py"):
            extra = _imports(path) - allowed - {"__init__"}
            if extra:
                wrong.append(f"{path.relative_to(SRC)} imports {sorted(extra)}")
    assert wrong == []


def test_product_code_never_imports_the_lab_statically() -> None:
    for role in ("core", "deploy", "node", "serve"):
        for path in (SRC / role).rglob("*.py"):
            assert "lab" not in _imports(path), path
