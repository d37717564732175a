"""The request path talks to scheduling only through the chooser's public API: it places,
asks for another engine, reports each leg's events to the chooser's bookings and says when a
request ended. A change to the scheduling model then never means editing the proxy."""

from __future__ import annotations

import ast
from pathlib import Path

SERVE = Path(__file__).resolve().parents[3] / "src" / "narwhal" / "serve"
ROUTER = SERVE / "router"
PROXY = ROUTER / "request" / "proxy.py"
# What the proxy may import from the scheduling family: the seam and the records it answers.
CHOOSER_API = {"choosers": {"EngineChooser"}, "engines": {"Engine", "Placement", "Refusal"}}
SCHEDULING = {p.stem for p in (ROUTER / "scheduling").glob("*.py")} - {"__init__"}


def scheduling_imports(path: Path) -> dict[str, set[str]]:
    """The names `path` imports from modules of the scheduling family, by module."""
    imported: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                "narwhal.serve"):
            last = node.module.rsplit(".", 1)[-1]
            if last in SCHEDULING:
                imported.setdefault(last, set()).update(a.name for a in node.names)
            else:
                for alias in node.names:
                    if alias.name in SCHEDULING:
                        imported.setdefault(alias.name, set()).add("*")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                last = alias.name.rsplit(".", 1)[-1]
                if alias.name.startswith("narwhal.serve") and last in SCHEDULING:
                    imported.setdefault(last, set()).add("*")
    return imported


def test_the_proxy_imports_from_scheduling_only_the_chooser_s_public_api() -> None:
    imported = scheduling_imports(PROXY)
    extra = {module: names - CHOOSER_API.get(module, set())
             for module, names in imported.items()}
    assert {m: n for m, n in extra.items() if n} == {}


def test_the_proxy_never_reads_or_writes_an_engine_s_load() -> None:
    tree = ast.parse(PROXY.read_text())
    touches = [node.lineno for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr == "load"]
    assert touches == []


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The rule above would fail on the proxy as it was: booking functions imported."""
    old = tmp_path / "proxy.py"
    old.write_text("from narwhal.serve.router.scheduling.scheduler import (\n"
                   "    decode_started, prefill_ended)\n"
                   "from narwhal.serve.router.scheduling import pricing\n")
    assert scheduling_imports(old) == {"scheduler": {"decode_started", "prefill_ended"},
                                       "pricing": {"*"}}
