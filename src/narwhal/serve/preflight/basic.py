"""The cheap gates: reach (health and version), model (what each engine serves), tokenize."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from narwhal.serve.engine_client import EngineCallFailed, EngineClient
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict, failed, passed, seconds, skipped

# Plain words, digits, accents and CJK: where two tokenizer revisions most often differ.
TOKENIZE_PROBE = ("probe tokenize: the tide turns over the harbour wall while ships wait for "
                  "the light and keepers count hours until the fleet comes home 0123456789 "
                  "ÆØÅ 漢字 é")


async def _reach_one(state: CheckState, client: EngineClient) -> Verdict:
    budget_s = state.options.reach_timeout_s
    budget = f"/health and /version <= {budget_s:g} s"
    started = time.perf_counter()
    try:
        async with asyncio.timeout(budget_s):
            await client.health()
            version = await client.version()
    except TimeoutError:
        state.fail("reach", client.id)
        return failed("reach", client.id, f"> {budget_s:g} s", budget,
                      f"{client.id} ({client.base_url}) did not answer /health and /version within "
                      f"{budget_s:g} s; check the engine is running (or raise --reach-timeout)")
    except EngineCallFailed as exc:
        state.fail("reach", client.id)
        return failed("reach", client.id, "no answer", budget,
                      f"{exc}; check the engine at {client.base_url} is running and reachable")
    took = time.perf_counter() - started
    return passed("reach", client.id, seconds(took), budget, f"vLLM {version}",
                  seconds=took, version=version)


async def reach(state: CheckState) -> list[Verdict]:
    return list(await asyncio.gather(*(_reach_one(state, c) for c in state.clients.values())))


async def _model_one(state: CheckState, client: EngineClient) -> Verdict:
    want = [state.fleet.model]
    budget = f"== {want}"
    blocked = state.blocker("model", client.id)
    if blocked:
        return skipped("model", client.id, blocked)
    try:
        served = await client.models()
    except EngineCallFailed as exc:
        state.fail("model", client.id)
        return failed("model", client.id, "no answer", budget, str(exc))
    if served != want:
        state.fail("model", client.id)
        return failed("model", client.id, str(served), budget,
                      f"{client.id} serves {served}, the fleet serves {state.fleet.model!r}; "
                      f"relaunch it with --served-model-name {state.fleet.model} or fix the fleet's "
                      "model", served=served)
    return passed("model", client.id, str(served), budget, served=served)


async def model(state: CheckState) -> list[Verdict]:
    return list(await asyncio.gather(*(_model_one(state, c) for c in state.clients.values())))


async def tokenize(state: CheckState) -> list[Verdict]:
    """Every engine tokenizes the same probe text to the same ids (the majority is the reference)."""
    ids: dict[str, list[int]] = {}
    out: list[Verdict] = []
    for client in state.clients.values():
        blocked = state.blocker("tokenize", client.id)
        if blocked:
            out.append(skipped("tokenize", client.id, blocked))
            continue
        try:
            ids[client.id] = await client.tokenize(state.fleet.model, TOKENIZE_PROBE)
        except EngineCallFailed as exc:
            state.fail("tokenize", client.id)
            out.append(failed("tokenize", client.id, "no answer", "POST /tokenize answers", str(exc)))
    if not ids:
        return out
    common, _ = Counter(tuple(v) for v in ids.values()).most_common(1)[0]
    agree = [eid for eid, v in ids.items() if tuple(v) == common]
    budget = f"same ids as {', '.join(agree)} ({len(common)} tokens)"
    for eid, got in ids.items():
        if tuple(got) == common:
            out.append(passed("tokenize", eid, f"{len(got)} tokens", budget, tokens=len(got)))
            continue
        state.fail("tokenize", eid)
        first = next((i for i, (a, b) in enumerate(zip(got, common, strict=False)) if a != b),
                     min(len(got), len(common)))
        out.append(failed("tokenize", eid, f"{len(got)} tokens, first difference at {first}",
                          budget, f"{eid} tokenizes differently from {', '.join(agree)}: it loaded "
                          "another tokenizer or model revision; launch every engine from the same "
                          "model folder", tokens=len(got), first_difference=first))
    return out
