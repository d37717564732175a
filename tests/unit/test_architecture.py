"""The folders are machine roles: imports flow only the permitted way."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "narwhal"
# `commands` (src/narwhal/commands.py) is the distribution root's table of the command groups
# that join the `narwhal` console script from outside deploy, such as the lab: deploy's CLI
# reads it so that product code itself never names the lab.
ALLOWED = {
    "core": {"core"},
    "deploy": {"core", "deploy", "commands"},
    "node": {"core", "node"},
    "serve": {"core", "serve"},
    "lab": {"core", "node", "serve", "lab"},
}
PRODUCT = ("core", "deploy", "node", "serve")
# Calls that load (and run) a module by a name that may be known only at run time; each must
# name its module literally so the import rule can judge it. `find_spec` (which node probes use
# to ask whether a stdlib module exists) is judged only when its name is literal.
DYNAMIC_LOADERS = {"import_module", "__import__", "run_module", "run_path"}
LOOKUPS = {"find_spec"}
LAB_NAME = re.compile(r"\bnarwhal[./]lab\b")


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


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _lab_references(path: Path, role: str) -> list[str]:
    """What in path names the lab or loads a module the import rule cannot see."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and LAB_NAME.search(node.value):
            found.append(f"line {node.lineno}: string naming the lab {node.value[:60]!r}")
        elif isinstance(node, ast.Call) and _callee(node) in DYNAMIC_LOADERS | LOOKUPS:
            first = node.args[0] if node.args else None
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                if _callee(node) in LOOKUPS:
                    continue
                found.append(f"line {node.lineno}: {_callee(node)} of a computed name "
                             "(name the module statically so its direction can be checked)")
            elif first.value.startswith("narwhal.") and \
                    first.value.split(".")[1] not in ALLOWED[role]:
                found.append(f"line {node.lineno}: {_callee(node)}({first.value!r})")
    return found


def test_product_code_never_names_the_lab_nor_loads_modules_by_computed_name() -> None:
    """A string or importlib call reaches the lab as surely as an import statement does."""
    wrong = [f"{path.relative_to(SRC)} {what}"
             for role in PRODUCT for path in sorted((SRC / role).rglob("*.py"))
             for what in _lab_references(path, role)]
    assert wrong == []


def test_the_lab_check_sees_what_the_import_check_cannot(tmp_path: Path) -> None:
    """The check itself: the forms of reaching the lab without an import statement."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import importlib\n"
        "LAB = 'narwhal.lab.cli'\n"
        "importlib.import_module(LAB)\n"
        "__import__('narwhal.' + 'lab')\n"
        "importlib.import_module('narwhal.serve.settings')\n"
        "importlib.import_module('narwhal.deploy.cli.inputs_cmd')\n"
        "importlib.util.find_spec('narwhal.lab')\n"
        "[importlib.util.find_spec(m) for m in ('venv', 'ensurepip')]\n")
    found = _lab_references(sample, "deploy")
    assert {line.split(":")[0] for line in found} == {"line 2", "line 3", "line 4", "line 5",
                                                      "line 7"}
