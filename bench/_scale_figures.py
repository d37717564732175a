"""The scale bench's arithmetic, apart from its lab: the critical path of a gate's remote
commands, Gate D's overhead per edge, the fit of each figure against the hosts, the plot."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

FIGURES = ("wall_s", "ws_cpu_s", "ws_bytes_sent", "ssh_connections", "critical_path_commands")
EXPLAINED = 0.98  # the lowest degree whose fit explains this share of the variance is named


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def critical_path(rows: list[dict[str, Any]]) -> tuple[int, float]:
    """The longest chain of commands in which each starts after the one before it ended:
    (commands in it, the seconds they ran). Commands by start; every command that has ended by
    the next one's start offers its chain, so one pass in time order finds the longest."""
    spans = sorted((_stamp(r["start"]), _stamp(r["end"])) for r in rows if r.get("end"))
    by_end = sorted(range(len(spans)), key=lambda i: spans[i][1])
    chain: list[tuple[int, float]] = [(0, 0.0)] * len(spans)
    best: tuple[int, float] = (0, 0.0)
    ended = 0
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        start, end = spans[i]
        while ended < len(by_end) and spans[by_end[ended]][1] <= start:
            best = max(best, chain[by_end[ended]])
            ended += 1
        chain[i] = (best[0] + 1, best[1] + end - start)
    return max(chain, default=(0, 0.0))


def edge_overhead_s(rows: list[dict[str, Any]], seconds: int) -> dict[str, Any]:
    """Gate D's sampling phase (first idle proof to last) beyond its samples, per edge."""
    idle = [r for r in rows if r.get("argv") and "idle" in r["argv"][1:2]]
    clients = [r for r in rows if r.get("argv") and r["argv"][:2] == ["iperf3", "--client"]]
    if not idle or not clients:
        return {"edges_sampled": len(clients)}
    span = max(_stamp(r["end"]) for r in idle) - min(_stamp(r["start"]) for r in idle)
    return {"edges_sampled": len(clients), "sampling_phase_s": round(span, 3),
            "edge_overhead_s": round((span - len(clients) * seconds) / len(clients), 3)}


def _fit(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """Least-squares fits of degree 0, 1 and 2 in the hosts; the lowest that explains enough."""
    x, y = np.array(xs, float), np.array(ys, float)
    total = float(((y - y.mean()) ** 2).sum())
    out: dict[str, Any] = {}
    named = None
    for degree, label in ((0, "constant"), (1, "linear"), (2, "quadratic")):
        if degree >= len(xs):
            break
        coefficients = np.polyfit(x, y, degree)
        residual = float(((np.polyval(coefficients, x) - y) ** 2).sum())
        explained = 1.0 if total == 0 else 1 - residual / total
        out[label] = {"coefficients": [round(float(c), 6) for c in coefficients],
                      "explained": round(explained, 4)}
        if named is None and explained >= EXPLAINED:
            named = label
    out["fit"] = named or "worse than quadratic"
    return out


def fits(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every gate's figures fitted against the hosts."""
    xs = [float(r["hosts"]) for r in rows]
    out: dict[str, dict[str, Any]] = {}
    for gate in rows[0]["gates"]:
        for figure in (*FIGURES, "edge_overhead_s"):
            ys = [r["gates"][gate].get(figure) for r in rows]
            if all(isinstance(y, (int, float)) for y in ys):
                out[f"{gate}.{figure}"] = _fit(xs, [float(y) for y in ys])  # type: ignore[arg-type]
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Per gate: wall time, workstation CPU and bytes sent against the hosts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["hosts"] for r in rows]
    panels = (("wall_s", "wall s"), ("ws_cpu_s", "workstation CPU s"),
              ("ws_bytes_sent", "bytes from the workstation"),
              ("critical_path_commands", "critical path, commands"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (figure, label) in zip(axes, panels, strict=True):
        for gate in rows[0]["gates"]:
            ax.plot(xs, [r["gates"][gate][figure] for r in rows], marker="o", label=gate)
        ax.set_xlabel("hosts")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
