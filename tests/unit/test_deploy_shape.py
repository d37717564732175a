"""Deploy's rules live in one home: no gate is named by the code that runs them all, no CLI
module reaches into another, and `narwhal deploy` calls gates as functions (no argv round
trip, no stdout capture, no file-descriptor games)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "src" / "narwhal" / "deploy"
GATE_NAMES = ("discover", "install", "engines", "fabric", "attest", "preflight", "serve")


def _sources(folder: Path) -> dict[Path, str]:
    return {p: p.read_text() for p in folder.rglob("*.py")}


def test_no_code_in_deploy_branches_on_a_gates_name() -> None:
    found = [f"{p.relative_to(DEPLOY)}:{n}" for p, text in _sources(DEPLOY).items()
             for n, line in enumerate(text.splitlines(), 1) if "gate.name ==" in line]
    assert found == []


def test_the_deploy_loop_and_the_status_rules_name_no_gate() -> None:
    """Every gate they handle comes from the specs and the command table."""
    for module in ("actions/deploy.py", "actions/report.py", "ledger/status.py"):
        tree = ast.parse((DEPLOY / module).read_text())
        named = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and node.value in GATE_NAMES]
        assert named == [], module


def test_cli_modules_import_no_other_cli_module_but_mains_command_table() -> None:
    wrong = []
    for path in (DEPLOY / "cli").glob("*.py"):
        if path.name in ("main.py", "__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "narwhal.deploy.cli"):
                wrong.append(f"{path.name} imports {node.module}")
    assert wrong == []


def test_no_file_descriptor_redirection_nor_stdout_capture_in_deploy() -> None:
    pattern = re.compile(r"\bdup2\b|redirect_stdout|redirect_stderr")
    found = [str(p.relative_to(DEPLOY)) for p, text in _sources(DEPLOY).items()
             if pattern.search(text)]
    assert found == []
