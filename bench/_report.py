"""Medians over repeats, ratios against Narwhal, and the table the bench prints."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

COLUMNS = ("router", "conc", "runs", "req/s", "p50 ms", "p99 ms", "added p50 ms",
           "router CPU us/req", "of which kernel", "CPU vs narwhal", "errors", "foreign CPU %")


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["target"], row["conc"])].append(row)
    out = []
    for (target, conc), group in groups.items():
        out.append({
            "target": target, "conc": conc, "runs": len(group),
            "rps": _median(group, "rps"),
            "p50_ms": _median(group, "p50_ms"),
            "p99_ms": _median(group, "p99_ms"),
            "cpu_us_per_req": _median(group, "cpu_us_per_req"),
            "cpu_us_per_req_all": [r["cpu_us_per_req"] for r in group],
            "sys_us_per_req": _median(group, "sys_us_per_req"),
            "errors": sum(r["errors"] for r in group),
            "foreign_pct": _median(group, "foreign_pct"),
        })
    direct = {s["conc"]: s["p50_ms"] for s in out if s["target"] == "direct"}
    ours = {s["conc"]: s["cpu_us_per_req"] for s in out if s["target"] == "narwhal"}
    for s in out:
        base = direct.get(s["conc"])
        s["added_p50_ms"] = (s["p50_ms"] - base) if (base is not None and s["p50_ms"] is not None
                                                    and s["target"] != "direct") else None
        mine = ours.get(s["conc"])
        s["cpu_ratio_vs_narwhal"] = (s["cpu_us_per_req"] / mine
                                     if mine and s["cpu_us_per_req"] else None)
    order = {"narwhal": 0, "narwhal-tokenize": 1, "vllm-router": 2, "narwhal-inference": 3,
             "floor": 4, "direct": 5}
    return sorted(out, key=lambda s: (s["conc"], order.get(s["target"], 9)))


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(summary: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for s in summary:
        ratio = s["cpu_ratio_vs_narwhal"]
        cells = [s["target"], str(s["conc"]), str(s["runs"]), _fmt(s["rps"]),
                 _fmt(s["p50_ms"], 2), _fmt(s["p99_ms"], 2), _fmt(s["added_p50_ms"], 2),
                 _fmt(s["cpu_us_per_req"]), _fmt(s.get("sys_us_per_req")),
                 f"{ratio:.2f}x" if ratio else "-",
                 str(s["errors"]), _fmt(s["foreign_pct"], 0)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(summary: list[dict[str, Any]]) -> list[str]:
    """The router bar, per concurrency: CPU/req below vllm-router's and within 1.3x of the
    same-run floor (the bare two-leg relay, bench/_floor_relay.py). The old bar, 1/8 of
    narwhal-inference, sat below the floor itself and is retired; its ratio is still shown."""
    out = []
    by = {(s["target"], s["conc"]): s for s in summary}
    for conc in sorted({s["conc"] for s in summary}):
        mine = by.get(("narwhal", conc), {}).get("cpu_us_per_req")
        nwi = by.get(("narwhal-inference", conc), {}).get("cpu_us_per_req")
        vr = by.get(("vllm-router", conc), {}).get("cpu_us_per_req")
        floor = by.get(("floor", conc), {}).get("cpu_us_per_req")
        if mine is None:
            continue
        parts = [f"c={conc}: narwhal {mine:.0f} us/req"]
        if vr:
            parts.append(f"vllm-router/narwhal = {vr / mine:.2f}x "
                         f"({'below' if mine < vr else 'NOT below'} vllm-router)")
        if floor:
            parts.append(f"narwhal/floor = {mine / floor:.2f}x "
                         f"({'within' if mine <= 1.3 * floor else 'NOT within'} 1.3x)")
        if nwi:
            parts.append(f"narwhal-inference/narwhal = {nwi / mine:.1f}x")
        out.append("; ".join(parts))
    return out
