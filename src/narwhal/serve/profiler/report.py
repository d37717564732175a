"""The run's result: a summary table for people, one JSON object (`--json`) for programs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.profiles import ProfileRow
from narwhal.serve.profiler.sweep import MIN_OVERLAP, Measurement

RESULT_SCHEMA = "narwhal.profile-result"
RESULT_VERSION = 1


@dataclass(frozen=True)
class EngineOutcome:
    engine_id: str
    row: ProfileRow | None
    error: str | None
    seconds: float
    notes: tuple[str, ...] = ()  # what the operator should know even when the row is fine


def overlap_notes(engine_id: str, m: Measurement) -> tuple[str, ...]:
    """Decode points whose streams the engine did not run together (batch below MIN_OVERLAP of
    the streams started, in every try): the row is honest about it (the measured batch is
    what it fits), but an engine that serializes requests is worth a look: a starved API
    server, a model thread sharing a core with another engine (vLLM's NIXL worker on CPU moves
    it to the machine's last core), or a `--max-num-seqs` below the concurrency asked for."""
    low = [p for p in m.decode if p.concurrency > 1 and p.running < MIN_OVERLAP * p.concurrency]
    if not low:
        return ()
    worst = ", ".join(f"{p.concurrency}x{p.context_tokens} as {p.running:.1f}" for p in low[:4])
    more = f" and {len(low) - 4} more" if len(low) > 4 else ""
    return (f"{engine_id}: {len(low)} of {len(m.decode)} decode points ran as a smaller batch "
            f"than the streams started ({worst}{more}); the fit uses the batch the engine ran. "
            "Is it short of CPU (its API server, or its model thread on a core another engine "
            "uses), or is --max-num-seqs below --decode-concurrency?",)


def result_document(outcomes: list[EngineOutcome], *, written: bool, store: str, samples: str,
                    elapsed_s: float) -> dict[str, Any]:
    return {
        "schema": RESULT_SCHEMA, "schema_version": RESULT_VERSION, "written": written,
        "store": store if written else None, "samples": samples if written else None,
        "elapsed_s": round(elapsed_s, 3),
        "engines": [{"engine_id": o.engine_id, "ok": o.row is not None, "error": o.error,
                     "seconds": round(o.seconds, 3), "notes": list(o.notes),
                     "row": o.row.model_dump(mode="json") if o.row else None} for o in outcomes],
    }


def print_table(outcomes: list[EngineOutcome], console: Console) -> None:
    table = Table(title="narwhal-profile")
    for name in ("engine", "prefill a s", "b s/tok", "c s/tok²", "fit/LOO", "decode base s",
                 "per-token s", "per-request s", "fit/LOO", "samples", "time s"):
        table.add_column(name, justify="left" if name == "engine" else "right")
    for o in outcomes:
        if o.row is None:
            table.add_row(o.engine_id, f"[red]failed[/red]: {o.error}", *[""] * 8, f"{o.seconds:.1f}")
            continue
        p, d = o.row.prefill, o.row.decode
        table.add_row(o.engine_id, f"{p.a_s:.4g}", f"{p.b_s_per_token:.3g}", f"{p.c_s_per_token2:.3g}",
                      f"{p.fit_error:.1%}/{p.loo_error:.1%}", f"{d.base_s:.4g}", f"{d.per_token_s:.3g}",
                      f"{d.per_request_s:.3g}", f"{d.fit_error:.1%}/{d.loo_error:.1%}",
                      f"{p.samples}+{d.samples}", f"{o.seconds:.1f}")
    console.print(table)
