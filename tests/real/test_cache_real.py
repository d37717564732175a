"""Cache-aware placement against real vLLM CPU engines publishing their KV cache events.

Three proofs, each on the session pair (both engines started with --kv-events-config):
- real vLLM's event stream decodes with core/kv/events.py, and the router's index fed by it
  predicts exactly the prefix hit the engine's own counter then reports;
- the router's token ids (the model's tokenizer.json and chat template, in the router process)
  equal the engine's /tokenize for completions and chat;
- through narwhal-serve, a conversation's second turn is placed on an engine that holds its
  first turn, and that engine's prefix-cache counter shows the hit the router predicted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from narwhal.serve.router.cache.feed import follow
from narwhal.serve.router.cache.fleet import FleetCache, PromptKeys
from narwhal.serve.router.cache.index import EngineCache
from narwhal.serve.router.cache.prompt_ids import PromptTokenizer
from narwhal.serve.router.scheduling.generation import parse_start_time, parse_version
from tests.fidelity import client
from tests.fidelity.requests import SERVED_NAME
from tests.real.live import Counters, completion, prompt_ids, serving
from tests.real.session import Pair

HITS = "vllm:prefix_cache_hits_total"


async def _fed(endpoint: str, cache: EngineCache, send: list[list[int]], url: str
               ) -> list[tuple[int, int]]:
    """(predicted, reported) hit tokens for each prompt sent, the cache fed by the events."""
    task = asyncio.create_task(follow("e", endpoint, "", cache))
    await asyncio.sleep(0.5)  # the SUB socket joins
    fleet = FleetCache({"e": cache})
    out = []
    try:
        for ids in send:
            predicted = fleet.matched_tokens(PromptKeys(ids))["e"]
            before = Counters.read(url)
            await asyncio.to_thread(completion, url, {"prompt": ids, "max_tokens": 1})
            reported = int(Counters.read(url).delta(before, HITS))
            out.append((predicted, reported))
            await asyncio.sleep(0.5)  # its batch reaches the subscriber
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return out


def test_real_events_feed_predictions_equal_to_the_engine_s_hits(pair: Pair) -> None:
    cache = EngineCache("events", 0)
    first = prompt_ids(901, 300)
    second = [*first[:260], *prompt_ids(902, 100)]
    results = asyncio.run(_fed(pair.prefill.spec.events_endpoint, cache,
                               [first, first, second], pair.prefill.url))
    assert cache.counts["refused"] == 0 and cache.counts["gaps"] == 0, cache.state()
    assert cache.block_size and cache.counts["stored"] > 0
    bs = cache.block_size
    assert results[0] == (0, 0)
    assert results[1] == (299 // bs * bs,) * 2
    assert results[2] == (260 // bs * bs,) * 2


def test_the_router_s_prompt_ids_are_the_engine_s(pair: Pair) -> None:
    router = PromptTokenizer(pair.model)
    text = "The quick brown fox, 42 times: <s> über naïve 漢字 \n\n ends."
    reply = client.post(f"{pair.prefill.url}/tokenize", {"model": SERVED_NAME, "prompt": text})
    assert router.completion_ids(text) == reply.json()["tokens"]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    reply = client.post(f"{pair.prefill.url}/tokenize",
                        {"model": SERVED_NAME, "messages": messages})
    assert router.chat_ids({"messages": messages}) == reply.json()["tokens"]


def _profiles(pair: Pair) -> dict[str, Any]:
    rows = []
    for name, engine in (("p", pair.prefill), ("d", pair.decode)):
        version = parse_version(client.get(f"{engine.url}/version").text.encode())
        start = parse_start_time(client.get(f"{engine.url}/metrics").text.encode())
        rows.append({
            "engine_id": name, "measured_at": datetime(2026, 12, 6, tzinfo=UTC).isoformat(),
            "generation": {"engine_version": version, "process_start_time_seconds": start},
            "prefill": {"a_s": 0.02, "b_s_per_token": 2e-4, "c_s_per_token2": 0.0,
                        "fit_error": 0.05, "loo_error": 0.05, "samples": 12,
                        "max_prompt_tokens": 512},
            "decode": {"base_s": 0.02, "per_token_s": 0.0, "per_request_s": 0.002,
                       "fit_error": 0.05, "loo_error": 0.05, "samples": 24, "max_requests": 16,
                       "max_resident_tokens": 8192}})
    return {"schema": "narwhal.profiles", "schema_version": 1, "model": SERVED_NAME,
            "profiles": rows}


@pytest.fixture
def router(pair: Pair, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    (tmp_path / "profiles.json").write_text(json.dumps(_profiles(pair)))
    engines = [{"id": name, "url": e.url, "role": role,
                "kv_events": {"endpoint": e.spec.events_endpoint}}
               for name, e, role in (("p", pair.prefill, "prefill"), ("d", pair.decode, "decode"))]
    fleet = {"schema": "narwhal.fleet", "schema_version": 1, "model": SERVED_NAME,
             "engines": engines, "slo": {"ttft_s": 20.0, "tpot_s": 2.0},
             "journal": {"path": "journal.jsonl"}, "profiles": {"path": "profiles.json"},
             "prefix_cache": {"tokenizer_dir": str(pair.model)}}
    with serving(tmp_path, fleet) as port:
        time.sleep(0.5)  # the SUB sockets join
        yield port, tmp_path / "journal.jsonl"


def _chat(port: int, messages: list[dict[str, str]]) -> str:
    reply = client.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                        {"model": SERVED_NAME, "messages": messages, "max_tokens": 8})
    assert reply.status == 200, reply.text[:500]
    return str(reply.json()["choices"][0]["message"]["content"])


def test_a_second_turn_is_placed_where_the_first_is_cached_and_the_engine_counts_it(
        pair: Pair, router: tuple[int, Path]) -> None:
    port, journal = router
    words = " ".join(f"w{i % 97}x{i // 97}" for i in range(90))
    first = [{"role": "user", "content": words}]
    answer = _chat(port, first)
    time.sleep(1.0)  # both engines' events reach the router
    urls = {"p": pair.prefill.url, "d": pair.decode.url}
    before = {name: Counters.read(url) for name, url in urls.items()}
    _chat(port, [*first, {"role": "assistant", "content": answer},
                 {"role": "user", "content": "and then?"}])
    for _ in range(50):
        rows = [json.loads(line) for line in journal.read_text().splitlines()]
        if len(rows) >= 2:
            break
        time.sleep(0.1)
    turn1, turn2 = rows[-2:]
    print(turn1["cache"], turn2["cache"], turn2["mode"], turn2["prefill_engine"])
    computing = turn2["prefill_engine"]
    held = turn2["cache"]["matched"][computing]
    assert held > 0 and held == turn2["cache"]["predicted_hit"]
    assert held == max(turn2["cache"]["matched"].values())
    hits = Counters.read(urls[computing]).delta(before[computing], HITS)
    assert hits == held, (hits, held)


def test_a_live_batch_still_has_the_captured_shape(pair: Pair) -> None:
    """The capture the emulator is held to (tests/component/engine/test_kv_events.py) still
    describes what this vLLM publishes."""
    from tests.fidelity.kv_events import LIVE, first_batch, shape
    ids = prompt_ids(903, 300)
    frames = first_batch(pair.decode.spec.events_endpoint,
                         lambda: completion(pair.decode.url, {"prompt": ids, "max_tokens": 1}))
    assert len(frames) == 3 and len(frames[1]) == 8
    assert shape(frames[2]) == shape(LIVE.read_bytes())
