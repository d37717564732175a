"""Continuous batching and the timing model, seen from outside as a router would see them."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.component.engine.client import get, metric, post
from tests.component.engine.conftest import StartEngine

pytestmark = pytest.mark.timeout(120)
STEP = 0.05  # seconds per decode step in these tests


def _concurrently(count: int, send: Any) -> list[Any]:
    results: list[Any] = [None] * count

    def one(i: int) -> None:
        results[i] = send(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_max_num_seqs_limits_concurrency_and_the_rest_wait(engines: StartEngine) -> None:
    engine = engines("--max-num-seqs", "2", "--emu-decode-base", str(STEP),
                     "--emu-decode-per-token", "0", "--emu-decode-per-request", "0",
                     "--emu-prefill-a", "0", "--emu-prefill-b", "0", "--emu-prefill-c", "0")
    began = time.monotonic()
    replies = _concurrently(6, lambda i: post(engine, "/v1/completions", {
        "prompt": f"request {i}", "max_tokens": 4, "ignore_eos": True}))
    took = time.monotonic() - began
    assert all(r.status == 200 for r in replies)
    state = get(engine, "/emu/state").json()["scheduler"]
    assert state["max_running_seen"] == 2
    assert state["finished"] == 6
    assert state["max_waiting_seen"] >= 1  # the others queued behind the two running
    # 3 batches of 2, 4 tokens each: the first token comes with the (free) prefill, so at least
    # 3 x 3 = 9 decode steps; one batch of 6 would take ~3-4.
    assert took >= 8 * STEP


def test_a_longer_prompt_takes_longer_to_first_token(engines: StartEngine) -> None:
    engine = engines("--emu-prefill-a", "0.01", "--emu-prefill-b", "0.0002",
                     "--emu-prefill-c", "0", "--no-enable-prefix-caching")

    def ttft(tokens: int) -> float:
        began = time.monotonic()
        reply = post(engine, "/v1/completions", {"prompt": [5] * tokens, "max_tokens": 1})
        assert reply.status == 200
        return time.monotonic() - began

    short, long = ttft(10), ttft(1500)
    assert long - short > 0.2  # 1490 extra tokens x 0.2 ms = 0.3 s


def test_prefix_cache_hits_are_counted_and_skip_prefill(engines: StartEngine) -> None:
    engine = engines("--block-size", "16")
    body = {"prompt": [7] * 100, "max_tokens": 1}
    post(engine, "/v1/completions", body)
    before = get(engine, "/metrics").body.decode()
    post(engine, "/v1/completions", body)
    after = get(engine, "/metrics").body.decode()
    hit = metric(after, "vllm:prefix_cache_hits_total") - metric(before,
                                                                 "vllm:prefix_cache_hits_total")
    assert hit == 96  # six full blocks of 16; the last token is always computed
    assert metric(after, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 96


def test_zero_delay_serves_without_sleeping(engines: StartEngine) -> None:
    engine = engines("--emu-zero-delay", "--emu-decode-base", "1.0")
    began = time.monotonic()
    reply = post(engine, "/v1/completions", {"prompt": "x", "max_tokens": 50, "ignore_eos": True})
    assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] == 50
    assert time.monotonic() - began < 2.0


def test_eos_and_min_tokens_decide_the_finish_reason(engines: StartEngine) -> None:
    engine = engines("--emu-eos-probability", "1", "--emu-zero-delay")
    stop = post(engine, "/v1/completions", {"prompt": "x", "max_tokens": 8,
                                            "return_token_ids": True}).json()
    assert stop["choices"][0]["finish_reason"] == "stop"
    assert stop["choices"][0]["token_ids"] == [1] and stop["choices"][0]["text"] == ""
    late = post(engine, "/v1/completions", {"prompt": "x", "max_tokens": 8, "min_tokens": 3}).json()
    assert late["usage"]["completion_tokens"] == 4
    ignored = post(engine, "/v1/completions", {"prompt": "x", "max_tokens": 8,
                                               "ignore_eos": True}).json()
    assert ignored["choices"][0]["finish_reason"] == "length"
    assert ignored["usage"]["completion_tokens"] == 8
