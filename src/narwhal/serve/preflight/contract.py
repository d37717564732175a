"""The contract gate: each engine's Gate C capture against core/kv's prediction for its launch
record, every checked pair by core/kv's pair rules, and the capture bound to the live process.

Its inputs are Gate C's evidence (preflight/captures.py), read and checked with everything
else the user wrote before any engine is called. A capture proves something only about the
process it was taken from, so the gate also reads each engine's generation now (/version and
process_start_time_seconds): an engine restarted since its capture fails here, with the work
that makes it valid again.
Without `--captures` the verdict is SKIP with that reason, never PASS.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.cache_layout import CacheLayout
from narwhal.core.errors import InputError, Problem
from narwhal.core.kv.capture.contract import (
    capture_findings,
    engine_findings,
    pair_problems,
    predicted,
)
from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.pair import check_pair
from narwhal.serve.engine_client import EngineCallFailed
from narwhal.serve.preflight.captures import EngineCapture
from narwhal.serve.preflight.pairs import all_pairs
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict, failed, pair_id, passed, skipped

NO_CAPTURES = ("no --captures DIR was given, so no engine's live KV layout can be compared with "
               "its launch record's prediction; pass Gate C's captures (`narwhal preflight` "
               "does)")
# process_start_time_seconds is a float the engine prints; the same process prints the same value.
SAME_START_S = 1e-3


async def _restarted(state: CheckState, engine_id: str, layout: CacheLayout) -> str | None:
    """Why the live engine is not the captured process, or None when it is."""
    try:
        live = await state.clients[engine_id].generation()
    except EngineCallFailed as exc:
        return f"its generation cannot be read now ({exc})"
    if abs(live.process_start_time_seconds - layout.process_start_time_seconds) > SAME_START_S:
        return (f"it was restarted since Gate C captured it (captured process started at "
                f"{layout.process_start_time_seconds:.3f}, the live one at "
                f"{live.process_start_time_seconds:.3f})")
    if live.engine_version != layout.version:
        return (f"it now reports vLLM {live.engine_version}, the capture {layout.version}")
    return None


async def _engine(state: CheckState, engine_id: str, ev: EngineCapture
                  ) -> tuple[Verdict, Geometry | None]:
    blocker = state.blocker("contract", engine_id)
    if blocker is not None:
        return skipped("contract", engine_id, blocker), None
    budget = "== core/kv's prediction for its launch record"
    try:
        geometry = predicted(engine_id, ev.record, ev.layout)
    except InputError as exc:
        state.fail("contract", engine_id)
        return failed("contract", engine_id, "no prediction", budget,
                      "; ".join(p.line() for p in exc.problems)), None
    problems = (capture_findings(engine_id, ev.record_sha256, ev.layout)
                + engine_findings(engine_id, geometry, ev.layout))
    why = await _restarted(state, engine_id, ev.layout)
    if why is not None:
        problems.append(Problem(engine_id, why, "capture it again (`narwhal engines`), then "
                                "re-run preflight"))
    measured = (f"hash {ev.layout.ranks[0].compatibility_hash[:12]}, {len(ev.layout.ranks)} "
                f"rank(s), started {ev.layout.process_start_time_seconds:.0f}")
    values: dict[str, Any] = {"compatibility_hash": geometry.compatibility_hash,
              "process_start_time_seconds": ev.layout.process_start_time_seconds,
              "launch_record_sha256": ev.record_sha256}
    if problems:
        state.fail("contract", engine_id)
        return failed("contract", engine_id, measured, budget,
                      "; ".join(p.line() for p in problems), **values), geometry
    return passed("contract", engine_id, measured, budget, **values), geometry


async def contract(state: CheckState) -> list[Verdict]:
    if state.captures is None:
        return [skipped("contract", "fleet", NO_CAPTURES)]
    out: list[Verdict] = []
    geometries: dict[str, Geometry] = {}
    for e in state.engines:
        verdict, geometry = await _engine(state, e.id, state.captures[e.id])
        out.append(verdict)
        if geometry is not None:
            geometries[e.id] = geometry
    for p, c in all_pairs(state.engines):  # cheap: every pair, whatever --ring says
        subject = pair_id(p, c)
        if p not in geometries or c not in geometries:
            out.append(skipped("contract", subject, f"{p if p not in geometries else c} has "
                               "no prediction"))
            continue
        problems = pair_problems(check_pair(geometries[p], geometries[c]))
        if problems:
            out.append(failed("contract", subject, f"{len(problems)} finding(s)",
                              "core/kv's pair rules", "; ".join(x.line() for x in problems)))
        else:
            out.append(passed("contract", subject, "compatible", "core/kv's pair rules"))
    return out
