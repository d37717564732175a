"""The runbook's five repeat-work rows are rows of data in deploy/gates/registry.py, each
carried by declared inputs or live kinds and proven by a named lab drill."""

from __future__ import annotations

import ast
from pathlib import Path

from narwhal.deploy.gates.registry import REPEAT_WORK, SPECS, declares

ROOT = Path(__file__).resolve().parents[3]
RUNBOOK = ROOT.parent / "shared" / "spec" / "fleet-deployment-runbook.txt"


def test_each_row_is_carried_by_what_its_gates_declare() -> None:
    for row in REPEAT_WORK:
        assert row.declared, row.change
        for gate, name in row.declared:
            assert declares(SPECS[gate], name), (row.change, gate, name)


def test_each_row_names_a_drill_that_exists() -> None:
    for row in REPEAT_WORK:
        path, test = row.drill.split("::")
        names = {n.name for n in ast.walk(ast.parse((ROOT / path).read_text()))
                 if isinstance(n, ast.FunctionDef)}
        assert test in names, row.drill


def test_the_rows_are_the_runbooks_five() -> None:
    assert len(REPEAT_WORK) == 5
    if RUNBOOK.exists():  # the spec beside the checkout, where there is one
        table = RUNBOOK.read_text().split("Repeat work when its measured input changes")[1]
        for row in REPEAT_WORK:
            assert row.change.split(" within")[0] in table, row.change
