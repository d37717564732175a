"""An emulator started with --kv-events-config publishes vLLM's KV events; the router's cache,
fed by them, predicts exactly the prefix hits the engine's own counters then report."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Callable

import aiohttp
import pytest

from narwhal.lab.engine.testing import RunningEngine, free_port
from narwhal.serve.router.cache.feed import follow
from narwhal.serve.router.cache.fleet import FleetCache, PromptKeys
from narwhal.serve.router.cache.index import EngineCache

BLOCK = 16
BLOCKS = 64


def _ids(seed: int, n: int) -> list[int]:
    """`n` token ids inside the tiny model's vocabulary, different for each seed."""
    return random.Random(seed).choices(range(10, 430), k=n)


def _events_args(port: int) -> tuple[str, ...]:
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{port}", "topic": "kv"}
    return ("--kv-events-config", json.dumps(config), "--block-size", str(BLOCK),
            "--num-gpu-blocks-override", str(BLOCKS), "--max-model-len", str(BLOCKS * BLOCK),
            "--served-model-name", "tiny-llama")


async def _hits(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/metrics") as reply:
        text = await reply.text()
    found = re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert found, "the engine exports vllm:prefix_cache_hits_total"
    return float(found.group(1))


async def _complete(http: aiohttp.ClientSession, url: str, ids: list[int]) -> None:
    body = {"model": "tiny-llama", "prompt": ids, "max_tokens": 1}
    async with http.post(f"{url}/v1/completions", json=body) as reply:
        assert reply.status == 200, await reply.text()


async def _settled(cache: EngineCache, batches: int) -> None:
    for _ in range(200):
        if cache.counts["batches"] >= batches:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no KV event batch {batches} within 2 s: {cache.state()}")


class Probe:
    """One engine, its event feed and the prediction for each prompt sent."""

    def __init__(self, engine: RunningEngine, port: int) -> None:
        self.engine = engine
        self.port = port
        self.cache = EngineCache("events", BLOCKS)
        self.fleet = FleetCache({"e0": self.cache})

    async def send(self, http: aiohttp.ClientSession, ids: list[int],
                   stores: bool = True) -> tuple[int, int]:
        """(predicted, reported) prefix-hit tokens for `ids`; waits for the engine's batch
        when the prompt stores new blocks."""
        predicted = self.fleet.matched_tokens(PromptKeys(ids))["e0"]
        before = await _hits(http, self.engine.url)
        batches = self.cache.counts["batches"]
        await _complete(http, self.engine.url, ids)
        reported = int(await _hits(http, self.engine.url) - before)
        if stores:
            await _settled(self.cache, batches + 1)
        return predicted, reported


def _run(engines: Callable[..., RunningEngine], body: Callable[[Probe, aiohttp.ClientSession],
                                                               object]) -> None:
    port = free_port()
    engine = engines(*_events_args(port), env={"VLLM_SERVER_DEV_MODE": "1"})
    probe = Probe(engine, port)

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(follow("e0", f"tcp://127.0.0.1:{port}", "kv", probe.cache,
                                          ready))
        await ready.wait()
        await asyncio.sleep(0.3)  # a SUB socket joins a few ms after connect
        try:
            async with aiohttp.ClientSession() as http:
                await body(probe, http)  # type: ignore[misc]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_every_prediction_equals_the_engine_s_reported_hit(engines: Callable[..., RunningEngine]
                                                           ) -> None:
    system = _ids(1, 3 * BLOCK)
    turn1 = [*system, *_ids(2, 40)]
    turn2 = [*turn1, *_ids(3, 30)]
    other_tenant = [*system, *_ids(4, 50)]

    async def body(probe: Probe, http: aiohttp.ClientSession) -> None:
        assert await probe.send(http, turn1) == (0, 0)
        assert await probe.send(http, turn2) == (80, 80)  # turn 1's 5 full blocks
        assert await probe.send(http, other_tenant) == (48, 48)  # the system prompt
        assert await probe.send(http, turn2, stores=False) == (112, 112)  # all but the last,
        # partial, block
        assert probe.cache.state()["events"]["gaps"] == 0  # type: ignore[index]

    _run(engines, body)


def test_evictions_and_a_reset_reach_the_router(engines: Callable[..., RunningEngine]) -> None:
    first = _ids(5, 4 * BLOCK + 1)

    async def body(probe: Probe, http: aiohttp.ClientSession) -> None:
        await probe.send(http, first)
        for n in range(BLOCKS // 8 + 1):  # 8 fresh blocks each: the LRU drops `first`
            await probe.send(http, _ids(100 + n, 8 * BLOCK))
        assert await probe.send(http, first) == (0, 0)
        assert probe.cache.counts["removed"] > 0
        async with http.post(f"{probe.engine.url}/reset_prefix_cache") as reply:
            assert reply.status == 200
        for _ in range(200):
            if probe.cache.counts["cleared"]:
                break
            await asyncio.sleep(0.01)
        assert probe.cache.blocks == 0
        assert await probe.send(http, first) == (0, 0)

    _run(engines, body)


def test_a_bad_events_config_stops_the_engine_naming_the_key(
        engines: Callable[..., RunningEngine]) -> None:
    from narwhal.lab.engine.testing import EngineStartFailed
    with pytest.raises(EngineStartFailed, match="enable_kv_cache_event"):
        engines("--kv-events-config", '{"enable_kv_cache_event": true}')


def test_the_emulator_publishes_the_shape_a_live_vllm_engine_publishes(
        engines: Callable[..., RunningEngine]) -> None:
    from tests.fidelity.kv_events import LIVE, first_batch, shape
    port = free_port()
    engine = engines(*_events_args(port))
    ids = _ids(9, 4 * BLOCK + 3)

    def send() -> None:
        async def go() -> None:
            async with aiohttp.ClientSession() as http:
                await _complete(http, engine.url, ids)
        asyncio.run(go())

    frames = first_batch(f"tcp://127.0.0.1:{port}", send)
    assert len(frames) == 3 and len(frames[1]) == 8
    assert shape(frames[2]) == shape(LIVE.read_bytes())


def test_a_reply_s_blocks_are_cached_for_the_next_turn(engines: Callable[..., RunningEngine]
                                                       ) -> None:
    prompt = _ids(11, 2 * BLOCK + 5)

    async def body(probe: Probe, http: aiohttp.ClientSession) -> None:
        request = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 3 * BLOCK,
                   "ignore_eos": True, "return_token_ids": True}
        async with http.post(f"{probe.engine.url}/v1/completions", json=request) as reply:
            assert reply.status == 200
            output = (await reply.json())["choices"][0]["token_ids"]
        whole = (len(prompt) + len(output) - 1) // BLOCK
        for _ in range(200):  # the prompt's blocks, then the reply's
            if probe.cache.blocks >= whole:
                break
            await asyncio.sleep(0.01)
        following = [*prompt, *output, *_ids(12, 10)]
        predicted, reported = await probe.send(http, following, stores=False)
        # every full block of prompt + reply but the last token's: 5 blocks of 16
        assert predicted == reported == whole * BLOCK

    _run(engines, body)


def test_published_block_hashes_are_unsigned_64_bit_as_vllm_s(
        engines: Callable[..., RunningEngine]) -> None:
    from tests.fidelity.kv_events import first_batch
    port = free_port()
    engine = engines(*_events_args(port))

    def send() -> None:
        async def go() -> None:
            async with aiohttp.ClientSession() as http:
                # 30 blocks: signed hashes would show a negative one but once in 2^30
                await _complete(http, engine.url, _ids(20, 30 * BLOCK + 1))
        asyncio.run(go())

    import msgpack
    frames = first_batch(f"tcp://127.0.0.1:{port}", send)
    hashes = [h for e in msgpack.unpackb(frames[2])[1] for h in e["block_hashes"]]
    assert hashes and all(0 <= h < 1 << 64 for h in hashes)
