"""The trial's report: one static HTML page with its pictures as PNG files beside it.

What an operator takes to their team after a trial, readable offline from the evidence folder
(no script, no font or style fetched from anywhere): the verdict per rate first, then SLO
attainment and goodput per rate, the TTFT and TPOT distributions against the SLO, each
engine's load over the trial (from the router's own journal), Gate D's fabric heatmap and the
timeline of every gate and activity attempt in the record. Every text that came from a record
is HTML-escaped; a picture whose data is missing is said so in words, never left as a broken
image.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

REPORT = "report.html"
# (heading, picture key, what the picture shows, what is said when it has no data), in order
SECTIONS = (
    ("Attainment and goodput", "attainment", "SLO attainment and goodput per rate",
     "no rate finished"),
    ("Latency against the SLO", "latency", "TTFT and TPOT distributions against the SLO",
     "no answers"),
    ("Per-engine load", "engine-load", "requests each engine held over the trial",
     "the router's journal had no rows of this trial"),
    ("Fabric (Gate D)", "fabric", "measured over required bandwidth per directed edge",
     "no passed Gate D attempt in the record"),
    ("Gate timeline", "timeline", "every gate and activity attempt in the record",
     "no finished attempt in the record"),
)
VERDICT_COLOURS = {"passed": "#93c47d", "blocked": "#f6b26b", "failed": "#e06666",
                   "running": "#b7b7b7"}


@dataclass(frozen=True)
class RateData:
    """One rate as the report reads it: its summary, the client's records (dicts as written to
    rate-<r>-records.jsonl) and the router journal's rows of the trial for that rate."""

    summary: dict[str, Any]
    records: Sequence[dict[str, Any]]
    journal: Sequence[dict[str, Any]]


@dataclass(frozen=True)
class AttemptSpan:
    """One attempt of the record for the timeline."""

    step: str
    attempt: str
    started: float  # epoch seconds
    seconds: float
    verdict: str


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    out = io.BytesIO()
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=90)
    _pyplot().close(fig)
    return out.getvalue()


def attainment_png(rates: Sequence[RateData], target: float) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels = [f"{r.summary['rate']:g}/s" for r in rates]
    x = range(len(rates))
    ax.bar(x, [100 * float(r.summary["attainment"]) for r in rates], color="#6fa8dc",
           label="SLO attainment")
    ax.axhline(100 * target, color="#cc0000", linestyle="--", label=f"target {target:.0%}")
    ax.set_ylim(0, 105)
    ax.set_ylabel("requests within SLO (%)")
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("offered rate")
    right = ax.twinx()
    right.plot(list(x), [float(r.summary["goodput_per_s"]) for r in rates], "o-",
               color="#38761d", label="goodput")
    right.set_ylabel("goodput (requests/s within SLO)")
    right.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="lower left", fontsize=8)
    ax.set_title("SLO attainment and goodput per rate")
    return _png(fig)


def latency_png(rates: Sequence[RateData], ttft_s: float, tpot_s: float) -> bytes:
    """Empirical distributions (share of requests at or below a latency) per rate, with the SLO
    as a vertical line: a curve that crosses the line low is a miss at that rate."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, slo, name in ((axes[0], "ttft_s", ttft_s, "TTFT"),
                               (axes[1], "tpot_s", tpot_s, "TPOT")):
        drawn = False
        for r in rates:
            values = sorted(float(v) for rec in r.records if (v := rec.get(key)) is not None)
            if values:
                share = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, share, where="post", label=f"{r.summary['rate']:g}/s")
                drawn = True
        ax.axvline(slo, color="#cc0000", linestyle="--", label=f"SLO {slo:g} s")
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{name} against the SLO" + ("" if drawn else " (no answers)"))
        ax.legend(fontsize=8)
    return _png(fig)


def engine_load(rows: Sequence[dict[str, Any]]) -> dict[str, list[tuple[float, int]]]:
    """Requests each engine held over time, as (seconds since the first request, count) steps:
    a request holds its prefill engine and its decode engine from its arrival at the router
    until its answer ended (the journal's received_at and total_s)."""
    events: dict[str, list[tuple[float, int]]] = {}
    starts = [float(r["received_at"]) for r in rows if isinstance(r.get("received_at"),
                                                                  (int, float))]
    if not starts:
        return {}
    zero = min(starts)
    for r in rows:
        try:
            begin, length = float(r["received_at"]) - zero, float(r.get("total_s") or 0.0)
        except (KeyError, TypeError, ValueError):
            continue
        for engine in {r.get("prefill_engine"), r.get("decode_engine")} - {None, ""}:
            events.setdefault(str(engine), []).extend([(begin, 1), (begin + length, -1)])
    out: dict[str, list[tuple[float, int]]] = {}
    for engine, changes in sorted(events.items()):
        level, steps = 0, [(0.0, 0)]
        for at, delta in sorted(changes):
            level += delta
            steps.append((at, level))
        out[engine] = steps
    return out


def engine_load_png(rates: Sequence[RateData]) -> bytes | None:
    load = engine_load([row for r in rates for row in r.journal])
    if not load:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for engine, steps in load.items():
        ax.step([t for t, _ in steps], [n for _, n in steps], where="post", label=engine)
    ax.set_xlabel("seconds since the trial's first request")
    ax.set_ylabel("requests held")
    ax.set_title("per-engine load over the trial (router journal)")
    ax.legend(fontsize=8)
    return _png(fig)


def timeline_png(spans: Sequence[AttemptSpan]) -> bytes | None:
    if not spans:
        return None
    plt = _pyplot()
    zero = min(s.started for s in spans)
    steps = list(dict.fromkeys(s.step for s in sorted(spans, key=lambda s: s.started)))
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(steps) + 1.4))
    for s in spans:
        ax.barh(steps.index(s.step), max(s.seconds, 0.5), left=s.started - zero,
                color=VERDICT_COLOURS.get(s.verdict, "#999999"), edgecolor="#444444")
    ax.set_yticks(range(len(steps)), steps)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the record's first attempt")
    ax.set_title("gate timeline (green passed, orange blocked, red failed)")
    return _png(fig)


def spans_from(ledger_doc: dict[str, Any],
               attempts: dict[tuple[str, str], dict[str, Any]]) -> list[AttemptSpan]:
    """The timeline's spans from the record: each attempt's attempt.json (`attempts` keyed by
    step and attempt id); an attempt without one (still running) is left out."""
    out = []
    for table in ("gates", "activities"):
        for step, entry in ledger_doc.get(table, {}).items():
            for attempt_id in entry.get("attempts", []):
                doc = attempts.get((step, attempt_id))
                if doc is None:
                    continue
                try:
                    out.append(AttemptSpan(step, attempt_id, float(doc["started_epoch"]),
                                           float(doc["duration_s"]), str(doc["verdict"])))
                except (KeyError, TypeError, ValueError):
                    continue
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _figure(name: str | None, alt: str, missing: str) -> str:
    if name is None:
        return f'<p class="missing">{html.escape(missing)}</p>'
    return (f'<figure><img src="{html.escape(name)}" alt="{html.escape(alt)}">'
            f"<figcaption>{html.escape(alt)}</figcaption></figure>")


def page(title: str, slo: dict[str, Any], rates: Sequence[RateData],
         pictures: dict[str, str | None], generated: float) -> str:
    """The HTML text; `pictures` maps each section to its PNG file name (None: no data)."""
    verdicts = "; ".join(f"{r.summary['rate']:g}/s {r.summary['verdict']}" for r in rates)
    header = ("rate/s", "verdict", "attainment", "goodput/s", "TTFT p50", "TTFT p99",
              "TPOT p50", "TPOT p99", "late sends", "client-limited", "client CPU",
              "reconciled")
    body_rows = []
    for r in rates:
        s = r.summary
        cells = (f"{s['rate']:g}", s["verdict"], f"{float(s['attainment']):.0%}",
                 s["goodput_per_s"], s["ttft_p50_s"], s["ttft_p99_s"], s["tpot_p50_s"],
                 s["tpot_p99_s"], s["late_sends"], s.get("client_limited"),
                 s.get("client_cpu_share"),
                 (s.get("reconciled") or {}).get("ok"))
        body_rows.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + "</tr>")
    when = datetime.fromtimestamp(generated).astimezone().isoformat(timespec="seconds")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:72em}"
        "table{border-collapse:collapse}td,th{border:1px solid #999;padding:.2em .6em}"
        "img{max-width:100%}.missing{color:#a61c00}figure{margin:1em 0}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>SLO: TTFT {_cell(slo.get('ttft_s'))} s, TPOT {_cell(slo.get('tpot_s'))} s. "
        f"Written {html.escape(when)}.</p>",
        f'<p id="verdict"><strong>Verdict:</strong> {html.escape(verdicts)}</p>',
        "<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr></thead>"
        "<tbody>" + "".join(body_rows) + "</tbody></table>",
        *(f"<h2>{html.escape(heading)}</h2>\n" + _figure(pictures.get(key), alt, missing)
          for heading, key, alt, missing in SECTIONS),
        "</body></html>", ""])


def build(title: str, slo: dict[str, Any], rates: Sequence[RateData], fabric_png: bytes | None,
          spans: Sequence[AttemptSpan], target: float, generated: float) -> dict[str, bytes]:
    """Every file of the report, by name: report.html and its PNGs."""
    files: dict[str, bytes] = {}
    pictures: dict[str, str | None] = {}
    made = {
        "attainment": attainment_png(rates, target) if rates else None,
        "latency": latency_png(rates, float(slo["ttft_s"]), float(slo["tpot_s"]))
        if rates else None,
        "engine-load": engine_load_png(rates),
        "fabric": fabric_png,
        "timeline": timeline_png(spans),
    }
    for key, data in made.items():
        name = f"report-{key}.png"
        pictures[key] = name if data else None
        if data:
            files[name] = data
    files[REPORT] = page(title, slo, rates, pictures, generated).encode()
    return files
