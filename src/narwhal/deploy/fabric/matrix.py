"""The edge matrix: every ordered host pair with required, measured, margin, verdict and the
fingerprint the sample holds for; as a document and as a heatmap picture (PNG) for the team.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from narwhal.core.documents import stamp

SCHEMA = "narwhal.fabric-edges"
VERSION = 1
VERDICTS = ("pass", "fail", "void")


@dataclass(frozen=True)
class EdgeRow:
    edge: str
    source: str
    destination: str
    required_gbps: float
    measured_gbps: float | None
    verdict: str  # pass, fail or void
    fingerprint: str
    measured_in: str  # the attempt whose sample this is (this one, or the one reused)
    reused: bool
    sample: str | None  # the artifact name in measured_in
    diagnosis: str | None  # the artifact name in measured_in, for a failing edge
    causes: tuple[str, ...] = ()

    @property
    def margin(self) -> float | None:
        """measured / required (1.0: exactly the budget)."""
        if self.measured_gbps is None or self.required_gbps <= 0:
            return None
        return self.measured_gbps / self.required_gbps

    def document(self) -> dict[str, Any]:
        return {"edge": self.edge, "source": self.source, "destination": self.destination,
                "required_gbps": self.required_gbps, "measured_gbps": self.measured_gbps,
                "margin": self.margin, "verdict": self.verdict,
                "fingerprint": self.fingerprint, "measured_in": self.measured_in,
                "reused": self.reused, "sample": self.sample, "diagnosis": self.diagnosis,
                "causes": list(self.causes)}


def row_from(doc: dict[str, Any]) -> EdgeRow:
    return EdgeRow(str(doc["edge"]), str(doc["source"]), str(doc["destination"]),
                   float(doc["required_gbps"]),
                   None if doc["measured_gbps"] is None else float(doc["measured_gbps"]),
                   str(doc["verdict"]), str(doc["fingerprint"]), str(doc["measured_in"]),
                   bool(doc["reused"]), doc.get("sample"), doc.get("diagnosis"),
                   tuple(str(c) for c in doc.get("causes") or ()))


def edges_document(rows: Sequence[EdgeRow], hosts: Sequence[str]) -> dict[str, Any]:
    return stamp(SCHEMA, VERSION, {"hosts": list(hosts),
                                   "edges": [r.document() for r in rows]})


def heatmap_png(rows: Sequence[EdgeRow], hosts: Sequence[str]) -> bytes:
    """Sources down, destinations across; each cell the measured rate over the budget, green
    when it passes, red when it fails, grey when void or unmeasured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    index = {h: i for i, h in enumerate(hosts)}
    n = len(hosts)
    codes = [[0.0] * n for _ in range(n)]  # 0 diagonal/unmeasured, 1 fail, 2 void, 3 pass
    labels = [[""] * n for _ in range(n)]
    for r in rows:
        i, j = index[r.source], index[r.destination]
        codes[i][j] = {"fail": 1.0, "void": 2.0, "pass": 3.0}.get(r.verdict, 0.0)
        measured = "-" if r.measured_gbps is None else f"{r.measured_gbps:.3g}"
        margin = "" if r.margin is None else (
            f"\n{r.margin:,.0f}x" if r.margin >= 100 else f"\n{r.margin:.2f}x")
        labels[i][j] = f"{r.verdict}\n{measured} / {r.required_gbps:.3g}{margin}" + (
            "\n(reused)" if r.reused else "")
    fig, ax = plt.subplots(figsize=(1.9 * n + 1.5, 1.6 * n + 1.2), dpi=100)
    ax.imshow(codes, cmap=ListedColormap(["#eeeeee", "#e06666", "#b7b7b7", "#93c47d"]),
              vmin=0, vmax=3)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, labels[i][j] or ("-" if i == j else "unmeasured"), ha="center",
                    va="center", fontsize=8)
    ax.set_xticks(range(n), hosts)
    ax.set_yticks(range(n), hosts)
    ax.set_xlabel("destination (consumer)")
    ax.set_ylabel("source (producer)")
    ax.set_title("fabric edges: measured / required Gbit/s")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()
