"""Cache-aware placement through the router to emulators that publish vLLM's KV events.

A conversation's first turn is split (prefill on p0, decode on a decode engine, whose pulled
KV its prefix cache then holds); its second turn resends the whole conversation, and the
router, fed by the engines' events and tokenizing with the model's own tokenizer.json, runs it
whole on the decode engine that holds it: the journal row names the matched tokens and the
decision, and the engine's own `cached_tokens` equals the hit the router priced. An engine
without events is followed by routing history, and the state says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.engine.testing import RunningEngine, free_port, start_engine, write_tiny_llama
from narwhal.lab.engine.tokenizer import word_text
from tests.component.serve.harness import Router, call, journal_rows

pytestmark = pytest.mark.timeout(180)
KV_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
TIMING = {"a": 0.004, "b": 1.5e-4, "base": 0.004}
ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-transfer-config", KV_BOTH,
               "--emu-platform", "cpu", "--dtype", "float32", "--enforce-eager",
               "--block-size", "32", "--kv-cache-memory-bytes", "64M",
               "--enable-prompt-tokens-details", "--emu-eos-probability", "0",
               "--emu-prefill-a", str(TIMING["a"]), "--emu-prefill-b", str(TIMING["b"]),
               "--emu-prefill-c", "0", "--emu-decode-base", str(TIMING["base"]),
               "--emu-decode-per-token", "0", "--emu-decode-per-request", "0.0002"]
ROLES = {"p0": "prefill", "d0": "decode", "d1": "decode"}
EVENTS = ("p0", "d0")  # d1 publishes none: the router follows it by routing history


def _generation(engine: RunningEngine) -> dict[str, Any]:
    from narwhal.serve.router.scheduling.generation import parse_start_time, parse_version
    version = parse_version(call(engine.port, "GET", "/version").body)
    start = parse_start_time(call(engine.port, "GET", "/metrics").body)
    return {"engine_version": version, "process_start_time_seconds": start}


def _profiles(engines: dict[str, RunningEngine]) -> dict[str, Any]:
    fit = {"fit_error": 0.01, "loo_error": 0.01}
    return {"schema": "narwhal.profiles", "schema_version": 1, "model": "tiny", "profiles": [
        {"engine_id": name, "generation": _generation(e),
         "measured_at": datetime(2026, 12, 6, tzinfo=UTC).isoformat(),
         "prefill": {"a_s": TIMING["a"], "b_s_per_token": TIMING["b"], "c_s_per_token2": 0.0,
                     "samples": 12, "max_prompt_tokens": 2048, **fit},
         "decode": {"base_s": TIMING["base"], "per_token_s": 0.0, "per_request_s": 0.0002,
                    "samples": 24, "max_requests": 64, "max_resident_tokens": 60000, **fit}}
        for name, e in engines.items()]}


@pytest.fixture(scope="module", params=[None, 0], ids=["tokenized-on-loop", "off-loop"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[dict[str, RunningEngine], Router, Path]]:
    """The same fleet twice: prompts tokenized on the event loop (the default for short ones)
    and every prompt tokenized on a worker thread (off_loop_tokens 0): the same placement."""
    root = tmp_path_factory.mktemp("cache")
    model = write_tiny_llama(root / "tiny")
    engines: dict[str, RunningEngine] = {}
    router: Router | None = None
    ports = {name: free_port() for name in EVENTS}
    try:
        for name in ROLES:
            args = list(ENGINE_ARGS)
            if name in ports:
                args += ["--kv-events-config", json.dumps(
                    {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{ports[name]}"})]
            engines[name] = start_engine(model, log_path=root / f"{name}.log", extra_args=args,
                                         env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"})
        (root / "profiles.json").write_text(json.dumps(_profiles(engines)))
        doc = {"schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
               "engines": [{"id": n, "url": e.url, "role": ROLES[n],
                            **({"kv_events": {"endpoint": f"tcp://127.0.0.1:{ports[n]}"}}
                               if n in ports else {})} for n, e in engines.items()],
               "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": str(root / "j.jsonl")},
               "profiles": {"path": str(root / "profiles.json")},
               "prefix_cache": {"tokenizer_dir": str(model),
                                **({} if request.param is None
                                   else {"off_loop_tokens": request.param})}}
        (root / "fleet.json").write_text(json.dumps(doc))
        router = Router(root / "fleet.json", free_port()).start()
        time.sleep(0.3)  # the router's SUB sockets join a few ms after they connect
        yield engines, router, root / "j.jsonl"
    finally:
        if router is not None and router.proc is not None and router.proc.poll() is None:
            router.stop()
        for engine in engines.values():
            engine.stop()


def _words(start: int, n: int) -> str:
    return "".join(word_text(start + i) for i in range(n))


def _chat(router: Router, messages: list[dict[str, str]]) -> str:
    reply = call(router.port, "POST", "/v1/chat/completions",
                 {"model": "tiny", "messages": messages, "max_tokens": 4})
    assert reply.status == 200, reply.body
    return str(reply.json()["choices"][0]["message"]["content"])


def test_a_conversation_s_next_turn_runs_where_its_kv_is_and_the_engine_reports_the_hit(
        fleet: tuple[dict[str, RunningEngine], Router, Path]) -> None:
    _, router, journal = fleet
    first = [{"role": "system", "content": _words(0, 60)},
             {"role": "user", "content": _words(100, 300)}]
    answer = _chat(router, first)
    time.sleep(0.3)  # the engines' events reach the router
    second = [*first, {"role": "assistant", "content": answer},
              {"role": "user", "content": _words(420, 20)}]
    _chat(router, second)
    rows = journal_rows(journal, expect=2)[-2:]
    turn1, turn2 = rows
    assert turn1["cache"]["decision"] == "split" and turn1["prefill_engine"] == "p0"
    holder = turn1["decode_engine"]
    assert turn1["cache"]["matched"] == {"p0": 0, "d0": 0, "d1": 0}
    held = turn2["cache"]["matched"][holder]
    # the first turn's whole blocks: its prompt less the partial last block
    assert held == (turn1["prompt_tokens"] - 1) // 32 * 32
    assert turn2["cache"]["decision"] == "local_cached"
    assert turn2["prefill_engine"] == turn2["decode_engine"] == holder
    assert turn2["cache"]["predicted_hit"] == turn2["cache"]["observed_hit"] == held


def test_the_state_says_how_each_engine_is_followed(
        fleet: tuple[dict[str, RunningEngine], Router, Path]) -> None:
    _, router, _ = fleet
    state = call(router.port, "GET", "/narwhal/state").json()["prefix_cache"]
    engines = state["engines"]
    assert engines["p0"]["mode"] == engines["d0"]["mode"] == "events"
    assert engines["d1"]["mode"] == "approximate"
    # sized from d1's own vllm:cache_config_info (64 MiB of tiny-llama KV, 32-token blocks)
    assert engines["d1"]["block_size"] == 32 and engines["d1"]["capacity_blocks"] > 0
    metrics = call(router.port, "GET", "/metrics").body.decode()
    assert 'narwhal_router_cache_mode{engine="d1",mode="approximate"} 1.0' in metrics
