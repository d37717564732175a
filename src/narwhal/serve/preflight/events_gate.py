"""The events gate: every engine the fleet says publishes KV cache events does, and what the
router learns from them predicts the engine's own prefix-cache hits.

Per engine with `kv_events` in the fleet: subscribe to its endpoint, send it a fresh prompt
of a few whole blocks (token ids from its own /tokenize, sent as ids so nothing is tokenized
twice), and require the BlockStored batches that cover it within the deadline; then send the
same prompt again and hold the hit the router's index predicts (FleetCache.matched_tokens) to
the engine's `vllm:prefix_cache_hits_total` delta, within one block. A silent endpoint is the
finding that matters most: the router would place on a cache it never hears about.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from narwhal.core.errors import ContractError
from narwhal.core.fleet import EngineEntry
from narwhal.core.kv.capture.endpoints import parse_cache_config_info
from narwhal.serve.engine_client import EngineCallFailed, EngineClient
from narwhal.serve.preflight.events_feed import EventIndex, subscribed
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict, failed, passed, skipped

HITS = "vllm:prefix_cache_hits_total"
FLAG = "--kv-events-config"
PROBE_BLOCKS = 3  # whole blocks in the probe prompt: a chain, not a single key


def cacheable_tokens(prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens a prefix cache can hold: whole blocks within the first len-1 (vLLM always
    computes the last prompt token), as the router's cache/blocks.py counts them."""
    return max(prompt_tokens - 1, 0) // block_size * block_size


@dataclass(frozen=True)
class Observed:
    """What one engine's probe saw; `judge` turns it into the verdict."""

    endpoint: str
    connected: bool
    block_size: int = 0
    prompt_tokens: int = 0
    batches: int = 0  # event batches received while the first prompt was served
    stored_tokens: int = 0  # of the prompt, as the index holds it after the first send
    predicted: int = 0  # the index's hit for the second send
    reported: float = 0.0  # the engine's prefix_cache_hits delta for the second send


def judge(engine_id: str, seen: Observed, deadline_s: float) -> Verdict:
    """The verdict of one engine's probe (pure: the rule, stated once)."""
    if not seen.connected:
        return failed("events", engine_id, "no publisher", f"a publisher at {seen.endpoint}",
                      f"nothing answered at {seen.endpoint} within {deadline_s:g} s, yet the "
                      f"fleet says {engine_id} publishes KV cache events: it was started without "
                      f"{FLAG} (or the port is closed to this host); relaunch it with "
                      f"NARWHAL_KV_EVENTS_PORT set (`narwhal engines`), or open the port to the "
                      "router host", endpoint=seen.endpoint)
    cacheable = cacheable_tokens(seen.prompt_tokens, seen.block_size)
    if seen.batches == 0 or seen.stored_tokens < cacheable:
        return failed("events", engine_id, f"{seen.batches} batch(es), {seen.stored_tokens} of "
                      f"{cacheable} tokens stored", f"BlockStored for the prompt within "
                      f"{deadline_s:g} s", f"{engine_id} accepted the subscription at "
                      f"{seen.endpoint} but did not publish the blocks of a {seen.prompt_tokens}"
                      f"-token prompt: check its {FLAG} (enable_kv_cache_events true, publisher "
                      "zmq) and that prefix caching is on (no --no-enable-prefix-caching)",
                      endpoint=seen.endpoint, batches=seen.batches,
                      stored_tokens=seen.stored_tokens)
    budget = f"== {HITS} delta ± {seen.block_size} (one block)"
    measured = f"predicted {seen.predicted}, engine {seen.reported:g} hit tokens"
    values: dict[str, Any] = {"endpoint": seen.endpoint, "predicted": seen.predicted,
              "reported": seen.reported, "block_size": seen.block_size}
    if abs(seen.predicted - seen.reported) > seen.block_size:
        return failed("events", engine_id, measured, budget,
                      f"the router's index, fed by {engine_id}'s events, predicts another hit "
                      "than the engine reports: its events and its cache disagree (a hash or "
                      "block size the router does not read alike); follow the engine's "
                      "BlockStored batches in the evidence", **values)
    return passed("events", engine_id, measured, budget, **values)


async def _prompt(client: EngineClient, model: str, tokens: int) -> list[int]:
    """`tokens` ids no cache holds yet: the engine's own tokenization of fresh words."""
    nonce = uuid.uuid4().hex[:12]
    text = " ".join(f"probe{nonce} w{i}" for i in range(tokens))
    ids = await client.tokenize(model, text)
    if len(ids) < tokens:
        raise EngineCallFailed(client.id, "POST /tokenize", f"{len(ids)} ids for {tokens} "
                               "words: cannot build the events probe")
    return ids[:tokens]


async def _hits(client: EngineClient) -> float:
    page = await client.metrics()
    if not page.has(HITS):
        raise EngineCallFailed(client.id, "GET /metrics", f"no {HITS}: the engine does not "
                               "count prefix-cache hits, so no prediction can be held to it")
    return page.total(HITS)


async def _complete(client: EngineClient, model: str, ids: list[int]) -> None:
    done = await client.complete(model, ids, 1)
    if done.status != 200:
        raise EngineCallFailed(client.id, "POST /v1/completions", f"answered {done.status}")


async def _stored(index: EventIndex, ids: list[int], want: int, deadline_s: float) -> int:
    """Prompt tokens the index holds once `want` are, or at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        held = index.matched_tokens(ids)
        if held >= want or time.monotonic() >= end:
            return held
        await asyncio.sleep(0.01)


async def _block_size(client: EngineClient) -> int:
    page = await client.metrics()
    try:
        infos = parse_cache_config_info(page.text.decode("utf-8", "replace"))
        block = infos[0].int_label("block_size")
    except ContractError as exc:
        raise EngineCallFailed(client.id, "GET /metrics", str(exc)) from None
    if not block:
        raise EngineCallFailed(client.id, "GET /metrics", "vllm:cache_config_info has no "
                               "block_size")
    return block


async def _probe(state: CheckState, client: EngineClient, entry: EngineEntry,
                 index: EventIndex) -> Observed:
    assert entry.kv_events is not None
    endpoint, deadline = entry.kv_events.endpoint, state.options.events_timeout_s
    block = await _block_size(client)
    ids = await _prompt(client, state.fleet.model, PROBE_BLOCKS * block + 1)
    async with subscribed(endpoint, entry.kv_events.topic, index, deadline) as connected:
        if not connected:
            return Observed(endpoint, False)
        await _complete(client, state.fleet.model, ids)
        stored = await _stored(index, ids, cacheable_tokens(len(ids), block), deadline)
        predicted = index.matched_tokens(ids)
        before = await _hits(client)
        await _complete(client, state.fleet.model, ids)
        reported = await _hits(client) - before
    return Observed(endpoint, True, block, len(ids), index.batches, stored, predicted,
                    reported)


async def _events_one(state: CheckState, client: EngineClient, entry: EngineEntry) -> Verdict:
    blocked = state.blocker("events", client.id)
    if blocked:
        return skipped("events", client.id, blocked)
    if state.event_index is None:
        return skipped("events", client.id, "no router index to predict with (run it "
                       "through narwhal-check)")
    try:
        seen = await _probe(state, client, entry, state.event_index())
    except EngineCallFailed as exc:
        state.fail("events", client.id)
        return failed("events", client.id, "no answer", "the probe's calls answer", str(exc))
    verdict = judge(client.id, seen, state.options.events_timeout_s)
    if verdict.status == "fail":
        state.fail("events", client.id)
    return verdict


async def events(state: CheckState) -> list[Verdict]:
    """One verdict per engine the fleet says publishes; none for the others."""
    publishing = [e for e in state.engines if e.kv_events is not None]
    return list(await asyncio.gather(*(_events_one(state, state.clients[e.id], e)
                                       for e in publishing)))
