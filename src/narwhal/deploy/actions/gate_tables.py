"""Each gate's summary table, as its command prints it after a pass (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def discover_table(result: dict[str, Any]) -> None:
    table = Table(title="discovered engines")
    for column in ("engine", "host", "GPUs", "TP", "fabric", "image", "model tree"):
        table.add_column(column)
    for e in result["engines"]:
        gpus = ", ".join(f"{g['index']}:{str(g['uuid'])[:12]}" for g in e["gpus"])
        table.add_row(e["engine"], e["host"], gpus, str(e["tensor_parallel_size"]),
                      f"{e['fabric']['interface']} {e['fabric']['address']} mtu "
                      f"{e['fabric']['mtu']}", str(e["image"].get("id", ""))[:19],
                      str(e["model"].get("model_tree_sha256", ""))[:12])
    Console().print(table)
    staged = result.get("checkpoint")
    if staged:
        card = staged.get("card")
        said = ("no model card" if card is None else
                f"license {card.get('license') or '-'}, gated {card.get('gated')}, base model "
                f"{', '.join(card.get('base_model') or []) or '-'}, pipeline "
                f"{card.get('pipeline_tag') or '-'}")
        Console().print(f"checkpoint {staged['repo_id']}@{staged['revision']} = commit "
                        f"{staged['commit']} ({staged['files']} files, {staged['bytes']} bytes); "
                        f"{said}")


def install_table(result: dict[str, Any]) -> None:
    table = Table(title=f"installed revision {result['revision'][:12]}")
    for column in ("host", "roles", "outcome", "files sent", "pip", "checked"):
        table.add_column(column)
    for alias, r in result["hosts"].items():
        table.add_row(alias, ", ".join(r["roles"]), r["outcome"], str(r["files_sent"]),
                      "ran" if r["pip_ran"] else "not needed", ", ".join(r["smoke"]))
    Console().print(table)


def engines_table(result: dict[str, Any]) -> None:
    table = Table(title="engines started and captured")
    for column in ("engine", "host", "vLLM", "compatibility hash", "healthy after"):
        table.add_column(column)
    for role, e in result["engines"].items():
        table.add_row(role, e["host"], e["version"], str(e["compatibility_hash"])[:16],
                      f"{e['healthy_after_s']:.1f} s")
    Console().print(table)


def fabric_table(result: dict[str, Any]) -> None:
    table = Table(title="fabric edges")
    for column in ("edge", "required Gbit/s", "measured Gbit/s", "margin", "verdict", "sample"):
        table.add_column(column)
    for e in result["edges"]:
        table.add_row(e["edge"], f"{e['required_gbps']:.4f}", f"{e['measured_gbps']:.3f}",
                      f"{e['margin']:.1f}x", e["verdict"],
                      f"reused from {e['measured_in']}" if e["reused"] else "measured")
    Console().print(table)


def attest_table(result: dict[str, Any]) -> None:
    table = Table(title=f"engines attested (checked from {result['router_host']})")
    for column in ("engine", "attestation", "compatibility hash", "process", "sidecar"):
        table.add_column(column)
    for role, e in result["engines"].items():
        table.add_row(role, str(e["digest"])[:19], str(e["compatibility_hash"])[:16],
                      f"{e['process']['runtime']} {str(e['process']['id'])[:12]}",
                      e["sidecar"])
    Console().print(table)


def preflight_table(result: dict[str, Any]) -> None:
    table = Table(title=f"preflight passed on {result['router_host']}")
    for column in ("gate", "passed"):
        table.add_column(column)
    table.add_row("profiled now", ", ".join(result["profiled"]) or "none (every row binds)")
    for gate, subjects in result["passed"].items():
        table.add_row(gate, ", ".join(subjects))
    Console().print(table)


def serve_table(result: dict[str, Any]) -> None:
    table = Table(title=f"serving on {result['router_host']} at {result['router_url']}")
    for column in ("part", "state"):
        table.add_column(column)
    table.add_row("router", f"{result['router']} (pid {result.get('pid', '-')})")
    table.add_row("prometheus", f"pid {result['prometheus_pid']}, "
                  f"{sum(v == '1' for v in result['up'].values())}/{len(result['up'])} up")
    t = result["tunnel"]
    table.add_row("private path", f"/ready {t['ready']}, completion {t['completion']}")
    table.add_row("dashboard", f"{sum(n > 0 for n in result['panels'].values())}/"
                  f"{len(result['panels'])} panels with data")
    table.add_row("grafana", result["grafana"])
    Console().print(table)
