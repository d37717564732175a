#!/usr/bin/env python3
"""The router CPU that cache-aware placement adds per request: tokenizing and matching.

    .venv/bin/python bench/cache_cost.py [--repeats 5] [--engines 4]

For prompts of 1k and 8k tokens, completions (text) and chat (messages through the chat
template), this times what `CacheView.before` and `placed` do on the request path: the
prompt's token ids from the model's tokenizer.json (the `tokenizers` library), its chained
block keys, the matched tokens on every engine (each holding the first half of the prompt, fed
as KV events would feed it) and, for engines without events, recording the prompt. Medians of
`--repeats` runs of CPU time per request (process_time), taskset to one core by the caller if
wanted. Two tokenizers: the lab's emulated llama3-8b vocabulary (one token per word) and the
real tier's byte-level BPE (tiny llama, close to one token per character) when its cache is
present. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from narwhal.core.kv.events import BlockStored, EventBatch  # noqa: E402
from narwhal.lab.engine.testing import write_llama3_8b  # noqa: E402
from narwhal.lab.engine.tokenizer import word_text  # noqa: E402
from narwhal.serve.router.cache.fleet import FleetCache, PromptKeys  # noqa: E402
from narwhal.serve.router.cache.index import EngineCache  # noqa: E402
from narwhal.serve.router.cache.prompt_ids import PromptTokenizer  # noqa: E402

REAL_MODEL_GLOB = "tiny-llama-*"
BLOCK = 16


def _text_of(tokenizer: PromptTokenizer, tokens: int) -> str:
    """A text the tokenizer encodes to about `tokens` ids (grown until it does)."""
    words: list[str] = []
    i = 0
    while True:
        chunk = "".join(word_text(300 + (i + k) % 4000) for k in range(256))
        words.append(chunk)
        i += 256
        ids = tokenizer.completion_ids("".join(words))
        assert ids is not None
        if len(ids) >= tokens:
            text = "".join(words)
            # trim to the token count by characters, roughly
            return text[: int(len(text) * tokens / len(ids))]


def _fleet(ids: list[int], engines: int) -> FleetCache:
    caches = {}
    half = ids[: len(ids) // 2 // BLOCK * BLOCK]
    for e in range(engines - 1):
        cache = EngineCache("events", 0)
        hashes = tuple(range(1, len(half) // BLOCK + 1))
        cache.apply(EventBatch(0, 0.0, (BlockStored(hashes, None, tuple(half), BLOCK),)))
        caches[f"e{e}"] = cache
    approx = EngineCache("approximate", 100_000, BLOCK)
    approx.routed(PromptKeys(half).keys(BLOCK))
    caches["approx"] = approx
    return FleetCache(caches)


def _one(tokenizer: PromptTokenizer, route: str, body: dict[str, Any], fleet: FleetCache
         ) -> None:
    ids = tokenizer.ids(route, body)
    assert ids is not None
    keys = PromptKeys(ids)
    fleet.matched_tokens(keys)
    fleet.routed("approx", keys)


def _per_request_us(tokenizer: PromptTokenizer, route: str, body: dict[str, Any],
                    fleet: FleetCache, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        _one(tokenizer, route, body, fleet)
    return (time.process_time() - start) / n * 1e6


def _tokenizers(work: Path) -> dict[str, Path]:
    found = {"emulated-llama3-8b": write_llama3_8b(work / "llama3")}
    real = sorted((Path.home() / ".cache" / "narwhal").glob(REAL_MODEL_GLOB))
    if real and (real[-1] / "tokenizer.json").exists():
        found["real-tiny-bpe"] = real[-1]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engines", type=int, default=4)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder in _tokenizers(Path(tmp)).items():
            tokenizer = PromptTokenizer(folder)
            for tokens in (1024, 8192):
                text = _text_of(tokenizer, tokens)
                for route, body in (("completions", {"prompt": text}),
                                    ("chat", {"messages": [{"role": "user", "content": text}]})):
                    ids = tokenizer.ids(route, body)
                    assert ids is not None
                    fleet = _fleet(ids, args.engines)
                    n = 400 if tokens <= 1024 else 60
                    _per_request_us(tokenizer, route, body, fleet, n // 4)  # warm
                    runs = [_per_request_us(tokenizer, route, body, fleet, n)
                            for _ in range(args.repeats)]
                    tok_only = statistics.median(
                        _tokenize_us(tokenizer, route, body, n) for _ in range(args.repeats))
                    stall = {way: round(statistics.median(
                        asyncio.run(_stalls(tokenizer, route, body, 20, way == "off_loop"))
                        for _ in range(args.repeats)), 2) for way in ("inline", "off_loop")}
                    rows.append({"tokenizer": name, "route": route, "prompt_tokens": len(ids),
                                 "engines": args.engines,
                                 "cpu_us_per_request": round(statistics.median(runs), 1),
                                 "of_which_tokenize_us": round(tok_only, 1),
                                 "loop_stall_ms": stall})
                    print(json.dumps(rows[-1]))
    out = REPO / "bench" / "results" / f"cache-cost-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps({"bench": "cache_cost", "repeats": args.repeats,
                               "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


async def _stalls(tokenizer: PromptTokenizer, route: str, body: dict[str, Any], n: int,
                  off_loop: bool) -> float:
    """The longest the event loop went without running another task while `n` prompts were
    tokenized one after another, inline (as before) or on a worker thread (as the router now
    does from prefix_cache.off_loop_tokens): what every other request on the router waits, in ms."""
    done, gaps = asyncio.Event(), [0.0]

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    for _ in range(n):
        if off_loop:
            await asyncio.to_thread(tokenizer.ids, route, body, True)
        else:
            tokenizer.ids(route, body)
            await asyncio.sleep(0)
    done.set()
    await tick
    return max(gaps) * 1e3


def _tokenize_us(tokenizer: PromptTokenizer, route: str, body: dict[str, Any], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        tokenizer.ids(route, body)
    return (time.process_time() - start) / n * 1e6


if __name__ == "__main__":
    sys.exit(main())
