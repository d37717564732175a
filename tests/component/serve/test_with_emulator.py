"""Through the router to two vLLM-faithful emulators: the KV really moves from producer to consumer.

The mini engine in this folder proves what the router sends; the emulator proves that what it
sends works against vLLM's behaviour: the decode engine pulls the prefill engine's KV over the
emulated NIXL path, which its `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`
counter shows.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from narwhal.lab.engine.testing import RunningEngine, free_port, start_engine, write_tiny_llama
from tests.component.serve.harness import Router, call, journal_rows

pytestmark = pytest.mark.timeout(180)
KV_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-transfer-config", KV_BOTH,
               "--emu-platform", "cpu", "--dtype", "float32", "--enforce-eager",
               "--kv-cache-memory-bytes", "64M", "--emu-zero-delay"]
_EXTERNAL = re.compile(
    r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\} ([0-9.e+]+)$',
    re.MULTILINE)


def _pulled_tokens(engine: RunningEngine) -> float:
    text = call(engine.port, "GET", "/metrics").body.decode()
    return sum(float(v) for v in _EXTERNAL.findall(text))


@contextmanager
def emulator_pd_fleet(root: Path, engine_args: list[str]) -> Iterator[tuple[RunningEngine, RunningEngine,
                                                                           Router, Path]]:
    """Two emulators (p0 prefill, d0 decode) started with `engine_args` and a router in front;
    all stopped on the way out. Yields (p0, d0, router, journal path)."""
    model = write_tiny_llama(root / "tiny")
    engines: list[RunningEngine] = []
    router: Router | None = None
    try:
        for name in ("p0", "d0"):
            engines.append(start_engine(model, log_path=root / f"{name}.log",
                                        extra_args=engine_args,
                                        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}))
        journal = root / "journal.jsonl"
        doc = {"schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
               "engines": [{"id": "p0", "url": engines[0].url, "role": "prefill"},
                           {"id": "d0", "url": engines[1].url, "role": "decode"}],
               "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": str(journal)}}
        (root / "fleet.json").write_text(json.dumps(doc))
        router = Router(root / "fleet.json", free_port()).start()
        yield engines[0], engines[1], router, journal
    finally:
        if router is not None and router.proc is not None and router.proc.poll() is None:
            router.stop()
        for engine in engines:
            engine.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningEngine, RunningEngine,
                                                                      Router, Path]]:
    with emulator_pd_fleet(tmp_path_factory.mktemp("emu"), ENGINE_ARGS) as started:
        yield started


@pytest.mark.parametrize(("path", "stream"), [
    ("/v1/completions", True), ("/v1/completions", False),
    ("/v1/chat/completions", True), ("/v1/chat/completions", False)])
def test_each_route_moves_the_kv_from_prefill_to_decode(
        fleet: tuple[RunningEngine, RunningEngine, Router, Path], path: str, stream: bool) -> None:
    _, decode, router, _ = fleet
    before = _pulled_tokens(decode)
    body: dict[str, object] = {"model": "tiny", "max_tokens": 6, "stream": stream}
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": "tell me about the sea"}]
    else:
        body["prompt"] = "tell me about the sea and the ships upon it"
    reply = call(router.port, "POST", path, body)
    assert reply.status == 200, reply.body[:500]
    if stream:
        events = reply.events()
        assert events[-1] == "[DONE]"
        assert events[0]["id"].startswith("chatcmpl-" if "chat" in path else "cmpl-")
    else:
        doc = reply.json()
        assert doc["object"] == ("chat.completion" if "chat" in path else "text_completion")
        assert doc["usage"]["completion_tokens"] >= 1
    assert _pulled_tokens(decode) > before


def test_the_journal_records_prompt_length_from_the_producer(
        fleet: tuple[RunningEngine, RunningEngine, Router, Path]) -> None:
    _, _, router, journal = fleet
    call(router.port, "POST", "/v1/completions",
         {"model": "tiny", "prompt": "one two three four", "max_tokens": 2},
         {"x-request-id": "emu-row-1"})
    deadline = time.monotonic() + 5
    while not (rows := [r for r in journal_rows(journal) if r["request_id"] == "emu-row-1"]):
        assert time.monotonic() < deadline, "the row never reached the journal"
        time.sleep(0.05)
    (row,) = rows
    assert row["outcome"] == "ok" and row["mode"] == "split"
    assert isinstance(row["prompt_tokens"], int) and row["prompt_tokens"] > 0


def _producer_kv_usage(engine: RunningEngine) -> float:
    text = call(engine.port, "GET", "/metrics").body.decode()
    (value,) = re.findall(r"^vllm:kv_cache_usage_perc\{[^}]*\} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(value)


def test_requests_that_cannot_fit_the_context_reserve_no_kv_on_the_producer(
        fleet: tuple[RunningEngine, RunningEngine, Router, Path]) -> None:
    """63 requests whose prompt plus max_tokens overflow the context (2048): each is refused
    with the client's numbers before a prefill leg reserves KV, so the producer's cache stays
    empty and the next ordinary request is served (the attack once left every other request a
    502 for the producer's KV lease time)."""
    prefill, _, router, _ = fleet
    prompt = "the sea " * 300
    for k in range(63):
        reply = call(router.port, "POST", "/v1/completions",
                     {"model": "tiny", "prompt": prompt, "max_tokens": 1800 + k})
        assert reply.status == 400, reply.body[:300]
        assert reply.json()["error"]["code"] == "context_length_exceeded"
        assert f"{1800 + k} in the completion" in reply.json()["error"]["message"]
    assert _producer_kv_usage(prefill) == 0.0
    ok = call(router.port, "POST", "/v1/completions",
              {"model": "tiny", "prompt": "tell me about the sea", "max_tokens": 4})
    assert ok.status == 200, ok.body[:300]
