"""The kv gate, the live KV contract: every ordered pair is shown to move KV, in rounds of
pairs that share no host (one at a time on a one-host fleet).

For each pair a fresh prompt (nonce first, several KV blocks long) is prefilled on the producer
(one token, KV kept) and decoded on the consumer with the producer's kv_transfer_params, exactly
as the router does. The KV is proven moved only by the consumer's own counters:
- `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}` must grow by exactly the
  prompt's token count (in vLLM the consumer counts the tokens it took from a remote producer);
- where the consumer exposes the NIXL connector's families, `vllm:nixl_xfer_time_seconds_count`
  must grow and `vllm:nixl_bytes_transferred_sum` with it, with no failed transfer. vLLM records
  a transfer on the engine that reads (the consumer in pull mode); a producer's vllm:nixl_*
  counters stay at zero, so they prove nothing and are not asked for.
Tokens coming back prove nothing: a consumer that recomputed the prompt answers just as well.
The client-visible first token (producer leg + consumer's first token) must come within the
deadline the router enforces, serving.first_token_timeout_s.
"""

from __future__ import annotations

import asyncio

from narwhal.serve.engine_client import (
    Completion,
    EngineCallFailed,
    Handoff,
    MetricsPage,
    NixlCounters,
    handoff,
)
from narwhal.serve.preflight.pairs import all_pairs, in_rounds, ring_pairs
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict, failed, pair_id, passed, seconds, skipped
from narwhal.serve.profiler.prompts import sized_prompt

DECODE_TOKENS = 2  # the consumer must produce tokens of its own, not only the producer's one


def _error(done: Completion) -> str:
    err = done.body.get("error")
    message = err.get("message") if isinstance(err, dict) else err
    return f"HTTP {done.status}: {message}"


def _moved(before: MetricsPage, after: MetricsPage, prompt_tokens: int,
           done: Handoff) -> tuple[list[str], dict[str, float]]:
    """Problems with the proof that the KV moved, and the counter deltas."""
    external = after.external_kv_tokens() - before.external_kv_tokens()
    values: dict[str, float] = {"external_kv_tokens": external, "prompt_tokens": prompt_tokens}
    problems: list[str] = []
    decode = done.decode
    assert decode is not None
    if external == 0 and decode.completion_tokens > 0:
        problems.append(f"consumer recomputed the prompt instead of pulling its KV: "
                        f"{decode.completion_tokens} token(s) came back but its external_kv_transfer "
                        "counter did not move")
    elif external != prompt_tokens:
        problems.append(f"consumer's external_kv_transfer counter moved by {external:g}, "
                        f"the prompt has {prompt_tokens} tokens (part of it was recomputed)")
    nb, na = before.nixl_transfers(), after.nixl_transfers()
    if nb is not None and na is not None:
        delta: NixlCounters = na.since(nb)
        values.update(nixl_transfers=delta.transfers, nixl_bytes=delta.bytes,
                      nixl_failed=delta.failed)
        if delta.failed > 0:
            problems.append(f"consumer recorded {delta.failed:g} failed NIXL transfer(s)")
        if delta.transfers < 1 or delta.bytes <= 0:
            problems.append(f"consumer's NIXL counters did not record a read "
                            f"({delta.transfers:g} transfers, {delta.bytes:g} bytes)")
    return problems, values


async def _one_pair(state: CheckState, producer: str, consumer: str) -> Verdict:
    subject = pair_id(producer, consumer)
    deadline = state.fleet.serving.first_token_timeout_s
    budget = f"first token <= {deadline:g} s; external KV == prompt tokens"
    for eid in (producer, consumer):
        blocked = state.blocker("kv", eid)
        if blocked:
            return skipped("kv", subject, blocked)
    p, c, model = state.clients[producer], state.clients[consumer], state.fleet.model
    try:
        prompt, _ = await sized_prompt(p, model, state.options.kv_tokens)
        before = await c.metrics()
        async with asyncio.timeout(2 * deadline + 5):
            done = await handoff(p, c, model, prompt, DECODE_TOKENS)
        after = await c.metrics()
    except TimeoutError:
        return failed("kv", subject, f"> {2 * deadline + 5:g} s", budget,
                      f"no first token from {consumer} for a prompt prefilled on {producer} within "
                      f"{2 * deadline + 5:g} s: the handoff hangs (check the fabric and both "
                      "engines' logs)")
    except EngineCallFailed as exc:
        return failed("kv", subject, "no answer", budget, str(exc))
    if done.decode is None:
        return failed("kv", subject, "producer leg failed", budget,
                      f"{producer} did not prefill for a remote decode ({_error(done.prefill)}); "
                      "is it launched with a kv_both or kv_producer --kv-transfer-config?")
    if done.decode.status != 200:
        return failed("kv", subject, "consumer leg failed", budget,
                      f"{consumer} could not decode {producer}'s prefill ({_error(done.decode)}); "
                      "check both engines' logs for the NIXL handshake")
    prompt_tokens = done.decode.prompt_tokens or done.prefill.prompt_tokens
    problems, values = _moved(before, after, prompt_tokens, done)
    first = done.first_token_s
    values.update(first_token_s=first, prefill_s=done.prefill.total_s,
                  handoff_s=done.decode.first_token_s)
    if first > deadline:
        problems.append(f"first token after {first:.3f} s misses the router's deadline "
                        f"serving.first_token_timeout_s {deadline:g} s (producer leg "
                        f"{done.prefill.total_s:.3f} s, consumer {done.decode.first_token_s:.3f} s)")
    measured = (f"first token {seconds(first)} (handoff {seconds(done.decode.first_token_s)}), "
                f"external KV {values['external_kv_tokens']:g}/{prompt_tokens}")
    if problems:
        return failed("kv", subject, measured, budget, f"{subject}: " + "; ".join(problems), **values)
    note = ""
    cal = state.calibration
    if cal is not None and first > cal.candidate_s:
        note = f"slower than the calibrated candidate {cal.candidate_s:g} s: re-calibrate"
    return passed("kv", subject, measured, budget, note, **values)


def _calibration_verdict(state: CheckState) -> Verdict | None:
    cal = state.calibration
    if cal is None:
        return None
    deadline = state.fleet.serving.first_token_timeout_s
    measured = f"deadline {deadline:g} s"
    budget = f">= calibrated candidate {cal.candidate_s:g} s ({state.calibration_path})"
    if deadline < cal.candidate_s:
        return failed("kv", "fleet deadline", measured, budget,
                      f"serving.first_token_timeout_s {deadline:g} s is below the calibrated "
                      f"candidate {cal.candidate_s:g} s; the router would refuse this fleet; "
                      "raise the deadline", candidate_s=cal.candidate_s, deadline_s=deadline)
    return passed("kv", "fleet deadline", measured, budget, f"rule: {cal.rule}",
                  candidate_s=cal.candidate_s, deadline_s=deadline)


async def kv(state: CheckState) -> list[Verdict]:
    ring = state.options.ring
    pairs = ring_pairs(state.engines) if ring else all_pairs(state.engines)
    out: list[Verdict] = []
    cal = _calibration_verdict(state)
    if cal is not None:
        out.append(cal)
    # no two pairs of a round share a host: each is timed as it would be alone
    out.extend(await in_rounds(state.engines, pairs, lambda p, c: _one_pair(state, p, c)))
    if ring:
        total = len(all_pairs(state.engines))
        out.append(skipped("kv", "other pairs",
                           f"--ring checked a subset: {len(pairs)} of {total} ordered pairs; run "
                           "without --ring to prove every pair"))
    return out
