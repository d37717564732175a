"""The pace gate: cold one-token probes per engine against its profile and the fleet median.

Each probe is a fresh prompt (a nonce first, so no prefix cache helps) of a fixed length, sent
with max_tokens 1, so what is timed is one prefill plus the HTTP round trip. The median of a
few probes is held to `pace_factor` times the profile's prediction and times the median of the
fleet's engines, each plus `pace_slack_s` for the round trip: an engine that got slower since
it was profiled, or is slower than its peers, fails and is named.
"""

from __future__ import annotations

import statistics

from narwhal.serve.engine_client import EngineCallFailed
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict, failed, passed, seconds, skipped
from narwhal.serve.profiler.prompts import renewed, sized_prompt


async def _probe(state: CheckState, engine_id: str) -> tuple[float, int, list[float]]:
    """Median one-token latency of fresh prompts on one engine, the prompt length, all samples."""
    client = state.clients[engine_id]
    model = state.fleet.model
    text, tokens = await sized_prompt(client, model, state.options.pace_tokens)
    samples = []
    for _ in range(state.options.pace_repeats):
        done = await client.complete(model, renewed(text), 1)
        if done.status != 200:
            raise EngineCallFailed(engine_id, "POST /v1/completions",
                                   f"answered {done.status}: {done.body.get('error')}")
        samples.append(done.total_s)
    return statistics.median(samples), tokens, samples


async def pace(state: CheckState) -> list[Verdict]:
    opts = state.options
    out: list[Verdict] = []
    measured: dict[str, tuple[float, int, list[float]]] = {}
    for e in state.engines:  # one at a time: a probe must not queue behind another engine's
        blocked = state.blocker("pace", e.id)
        if blocked:
            out.append(skipped("pace", e.id, blocked))
            continue
        try:
            measured[e.id] = await _probe(state, e.id)
        except EngineCallFailed as exc:
            state.fail("pace", e.id)
            out.append(failed("pace", e.id, "no answer", "a one-token completion", str(exc)))
    if not measured:
        return out
    median = statistics.median(m for m, _, _ in measured.values())
    assert state.store is not None  # pace needs the profile gate, which loaded it
    for eid, (took, tokens, samples) in measured.items():
        row = state.store.row(eid)
        assert row is not None
        predicted = row.prefill.seconds(tokens)
        allow_profile = opts.pace_factor * predicted + opts.pace_slack_s
        allow_median = opts.pace_factor * median + opts.pace_slack_s
        budget = (f"<= {opts.pace_factor:g} x predicted {seconds(predicted)} and x fleet median "
                  f"{seconds(median)}, + {opts.pace_slack_s:g} s")
        values = {"seconds": took, "samples_s": samples, "prompt_tokens": tokens,
                  "predicted_s": predicted, "fleet_median_s": median, "factor": opts.pace_factor}
        reasons = []
        if took > allow_profile:
            reasons.append(f"{took / max(predicted, 1e-9):.1f}x its profile's prediction "
                           f"{predicted:.3f} s")
        if took > allow_median:
            reasons.append(f"{took / max(median, 1e-9):.1f}x the fleet median {median:.3f} s")
        if reasons:
            state.fail("pace", eid)
            out.append(failed("pace", eid, seconds(took), budget,
                              f"{eid} took {took:.3f} s for a cold {tokens}-token prefill: "
                              f"{' and '.join(reasons)} (factor allowed {opts.pace_factor:g}, "
                              "flag --pace-factor); find what slowed it (thermal, co-tenant, "
                              "clocks) or re-profile it", **values))
        else:
            out.append(passed("pace", eid, seconds(took), budget, f"{tokens}-token prompt", **values))
    return out
