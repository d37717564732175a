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
        "importlib.import_module('narwhal.serve.router.settings')\n"
        "importlib.import_module('narwhal.deploy.cli.inputs_cmd')\n"
        "importlib.util.find_spec('narwhal.lab')\n"
        "[importlib.util.find_spec(m) for m in ('venv', 'ensurepip')]\n")
    found = _lab_references(sample, "deploy")
    assert {line.split(":")[0] for line in found} == {"line 2", "line 3", "line 4", "line 5",
                                                      "line 7"}


# Inside serve/: the folders are jobs. The router (serve/router/) is one program; the
# profiler and preflight are others. The router imports nothing of serve/ outside router/; the
# profiler and preflight never import router/ nor the command lines at serve/'s top (they reach
# engines through serve/engine_client.py). Inside the router, the client front and
# observability read placement (scheduling/) only through the modules they read when serve/
# was split by job, and the data path (request/proxy.py) only through those named below.
SERVE = SRC / "serve"
ROUTER_PKG = "narwhal.serve.router"
CLIS = {"narwhal.serve.serve_cli", "narwhal.serve.profile_cli", "narwhal.serve.check_cli"}
SCHEDULING_PKG = "narwhal.serve.router.scheduling."
SCHEDULING_SEEN_FROM = {
    "front": {"engines", "generation", "roles", "scheduler"},
    "observe": {"engines", "roles", "scheduler"},
}
PROXY_SCHEDULING = {"choosers", "engines"}


def _is_module(dotted: str) -> bool:
    path = SRC.parent / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _serve_imports(path: Path) -> set[str]:
    """The narwhal.serve modules path imports, by dotted name: `from a.b import c` of a module c
    counts as a.b.c, of anything else as a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if _is_module(full) else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.startswith("narwhal.serve.")}


def _files(folder: Path) -> list[Path]:
    files = sorted(folder.rglob("*.py"))
    assert files, f"{folder} has no modules: the rule would hold vacuously"
    return files


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_profiler_and_preflight_never_import_the_router_nor_the_command_lines() -> None:
    wrong = [f"{path.relative_to(SRC)} imports {name}"
             for part in ("profiler", "preflight") for path in _files(SERVE / part)
             for name in sorted(_serve_imports(path))
             if _in(name, ROUTER_PKG) or name in CLIS]
    assert wrong == []


def test_the_router_imports_nothing_of_serve_outside_the_router() -> None:
    """Not the profiler, preflight, the measuring engine client nor the command lines."""
    wrong = [f"{path.relative_to(SRC)} imports {name}"
             for path in _files(SERVE / "router") for name in sorted(_serve_imports(path))
             if not _in(name, ROUTER_PKG)]
    assert wrong == []


def test_front_and_observe_read_only_their_share_of_scheduling() -> None:
    wrong = [f"{path.relative_to(SRC)} imports {name}"
             for part, allowed in SCHEDULING_SEEN_FROM.items()
             for path in _files(SERVE / "router" / part)
             for name in sorted(_serve_imports(path))
             if name.startswith(SCHEDULING_PKG) and name[len(SCHEDULING_PKG):] not in allowed]
    assert wrong == []


def test_the_data_path_reads_scheduling_only_through_named_modules() -> None:
    proxy = SERVE / "router" / "request" / "proxy.py"
    used = {name[len(SCHEDULING_PKG):] for name in _serve_imports(proxy)
            if name.startswith(SCHEDULING_PKG)}
    assert used <= PROXY_SCHEDULING, sorted(used - PROXY_SCHEDULING)
