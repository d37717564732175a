"""The check's three outputs: a human table, one JSON document, and the evidence file.

All three are rendered from the same evidence document, so what the operator reads, what a
script parses and what is kept as proof cannot disagree. Nothing here measures or decides.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from narwhal.core.private_file import write_private_json
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict

SCHEMA = "narwhal.preflight-evidence"
VERSION = 1
_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}


def evidence_path(fleet_path: Path, now: datetime) -> Path:
    """`preflight-<UTC timestamp>.json` beside the fleet document, never an existing file."""
    base = fleet_path.resolve().parent / f"preflight-{now.strftime('%Y%m%dT%H%M%SZ')}"
    path, n = base.with_suffix(".json"), 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}.json")
    return path


def evidence(state: CheckState, verdicts: list[Verdict], started: datetime, finished: datetime,
             mode: str) -> dict[str, Any]:
    """Every verdict and measurement of one run; engine URLs and ids, never a tenant key."""
    counts = Counter(v.status for v in verdicts)
    options = {k: (str(v) if isinstance(v, Path) else v)
               for k, v in dataclasses.asdict(state.options).items()}
    cal = state.calibration
    return {
        "schema": SCHEMA, "schema_version": VERSION, "mode": mode,
        "fleet": str(state.fleet_path), "model": state.fleet.model,
        "ok": counts["fail"] == 0, "started_at": started.isoformat(),
        "finished_at": finished.isoformat(), "options": options,
        "engines": [{"id": e.id, "url": e.url, "role": e.role} for e in state.engines],
        "generations": {eid: g.model_dump(mode="json") for eid, g in state.generations.items()},
        "deadline": {"first_token_timeout_s": state.fleet.serving.first_token_timeout_s,
                     "calibrated_candidate_s": cal.candidate_s if cal else None,
                     "calibration": str(state.calibration_path) if cal else None},
        "summary": {"pass": counts["pass"], "fail": counts["fail"], "skip": counts["skip"]},
        "verdicts": [v.document() for v in verdicts],
    }


def write_evidence(path: Path, document: dict[str, Any]) -> None:
    write_private_json(path, document)


def print_json(document: dict[str, Any], out: TextIO) -> None:
    out.write(json.dumps(document, indent=1) + "\n")


def print_table(document: dict[str, Any], out: TextIO) -> None:
    """One row per verdict, then every failure and skip as one plain line (easy to grep)."""
    table = Table(title=f"narwhal-check: {document['fleet']} ({document['model']})")
    for column in ("gate", "subject", "verdict", "measured", "budget"):
        table.add_column(column)
    for v in document["verdicts"]:
        status = v["status"]
        table.add_row(v["gate"], v["subject"], f"[{_STYLE[status]}]{status.upper()}[/]",
                      v["measured"], v["budget"])
    Console(file=out, width=160, soft_wrap=False).print(table)
    for v in document["verdicts"]:
        if v["status"] != "pass":
            out.write(f"{v['status'].upper()} {v['gate']} {v['subject']}: {v['detail']}\n")
    s = document["summary"]
    out.write(f"{s['pass']} passed, {s['fail']} failed, {s['skip']} skipped\n")
