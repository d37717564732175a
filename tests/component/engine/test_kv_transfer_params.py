"""kv_transfer_params over HTTP, as vLLM's pull mode accepts and returns them.

Every engine here runs the emulator's own NIXL connector: real side-channel handshakes and
real KV bytes over loopback TCP, so what is counted and returned is what a router would see.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.engine.testing import RunningEngine, free_port, write_tiny_llama
from tests.component.engine.client import get, metric, post
from tests.component.engine.conftest import StartEngine

pytestmark = pytest.mark.timeout(120)
PROMPT = "the people of the world were right about the water and the city"
INTERNAL_ERROR = {"error": {"message": "Internal server error", "type": "InternalServerError",
                            "param": None, "code": 500}}
ENGINE_DEAD = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32.0"
                          / "enginecore-dead.json").read_text())
COMMON = ("--served-model-name", "tiny-llama", "--kv-cache-memory-bytes", "64M",
          "--emu-platform", "cpu", "--dtype", "float32", "--max-model-len", "512")
LOOPBACK = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}


def wait_for(condition: Callable[[], bool], limit_s: float = 10.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def with_connector(engines: StartEngine, role: str, **config: Any) -> RunningEngine:
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": role,
                     "kv_buffer_device": "cpu", **config})
    return engines(*COMMON, "--kv-transfer-config", kv, env=LOOPBACK)


def prefill(engine: RunningEngine) -> dict[str, Any]:
    reply = post(engine, "/v1/completions", {
        "model": "tiny-llama", "prompt": PROMPT, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}})
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.json()
    return body


def decode(engine: RunningEngine, params: dict[str, Any] | None, **extra: Any) -> Any:
    return post(engine, "/v1/completions", {
        "model": "tiny-llama", "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True,
        "return_token_ids": True, "logprobs": 1, "kv_transfer_params": params, **extra})


def test_without_a_connector_kv_params_are_ignored(engines: StartEngine) -> None:
    engine = engines(*COMMON)
    body = prefill(engine)
    assert body["kv_transfer_params"] is None
    assert body["usage"]["completion_tokens"] == 1


def test_the_producer_returns_pull_mode_params_at_the_top_level(engines: StartEngine) -> None:
    producer = with_connector(engines, "kv_both")
    body = prefill(producer)
    params = body["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["transfer_mode"] == "pull"
    assert params["remote_request_id"].startswith(body["id"] + "-0-")
    assert params["remote_engine_id"] == get(producer, "/emu/state").json()["engine_id"]
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1",
                                                             producer.side_channel_port)
    assert "kv_transfer_params" not in body["choices"][0]


def test_a_kv_both_handoff_decodes_like_a_local_engine_and_counts_pulled_tokens(
        engines: StartEngine) -> None:
    producer = with_connector(engines, "kv_both")
    consumer = with_connector(engines, "kv_both")
    local = engines(*COMMON)
    params = prefill(producer)["kv_transfer_params"]
    handed, reference = decode(consumer, params), decode(local, None)
    assert handed.status == 200, handed.body
    ours, theirs = handed.json()["choices"][0], reference.json()["choices"][0]
    assert ours["token_ids"] == theirs["token_ids"]
    assert ours["logprobs"] == theirs["logprobs"]
    text = get(consumer, "/metrics").body.decode()
    prompt_len = handed.json()["usage"]["prompt_tokens"]
    assert metric(text, "vllm:prompt_tokens_by_source_total",
                  source="external_kv_transfer") == prompt_len
    assert metric(text, "vllm:nixl_xfer_time_seconds_count") == 1
    assert metric(text, "vllm:nixl_bytes_transferred_sum") > 0
    assert metric(text, "vllm:nixl_num_failed_transfers_total") == 0
    assert "NIXL compatibility check passed" in consumer.log_text()


def test_params_without_block_ids_kill_the_engine_like_vllm_0_32(engines: StartEngine) -> None:
    """`{"do_remote_prefill": true}` alone trips an assertion in vLLM 0.32's scheduler: the
    engine core dies, the request gets the captured EngineDeadError body, the server exits."""
    consumer = with_connector(engines, "kv_both")
    reply = decode(consumer, {"do_remote_prefill": True})
    assert (reply.status, reply.json()) == (500, ENGINE_DEAD)
    assert consumer.process.wait(timeout=15) == 1
    log = consumer.log_text()
    assert "EngineCore encountered a fatal error." in log
    assert "carry no remote_block_ids" in log


def test_a_dead_engine_fails_a_stream_with_the_engine_dead_event(engines: StartEngine) -> None:
    consumer = with_connector(engines, "kv_both")
    streamed = decode(consumer, {"do_remote_prefill": True, "remote_block_ids": []}, stream=True)
    assert streamed.status == 200
    assert streamed.events() == [ENGINE_DEAD, "[DONE]"]
    assert consumer.process.wait(timeout=15) == 1


def test_params_with_blocks_but_no_address_wait_for_a_load_that_never_starts(
        engines: StartEngine) -> None:
    """Block ids without the producer's address: vLLM logs `Got invalid KVTransferParams` and
    parks the request for a KV load nobody starts; the engine itself keeps serving."""
    consumer = with_connector(engines, "kv_both")
    parked = "vllm:num_requests_kv_fetch_by_stage"
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 4, "kv_transfer_params": {
        "do_remote_prefill": True, "remote_block_ids": [[1]], "remote_engine_id": "x"}}
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(post, consumer, "/v1/completions", body, timeout=4.0)
        assert wait_for(lambda: metric(get(consumer, "/metrics").body.decode(), parked,
                                       stage="waiting_to_start") == 1)
        assert decode(consumer, None).status == 200  # the engine itself keeps serving
        text = get(consumer, "/metrics").body.decode()
        assert metric(text, "vllm:num_requests_waiting") == 1
        with pytest.raises(TimeoutError):
            waiting.result()
    assert "Got invalid KVTransferParams" in consumer.log_text()
    # The client gave up and vLLM aborts the request; nothing of it was ever computed.
    assert wait_for(lambda: metric(get(consumer, "/metrics").body.decode(), parked,
                                   stage="waiting_to_start") == 0)
    text = get(consumer, "/metrics").body.decode()
    assert metric(text, "vllm:request_success_total", finished_reason="length") == 1


def test_params_a_client_got_wrong_fail_the_load_with_http_500(engines: StartEngine) -> None:
    """Every key present but unusable values (a port that is not a port): the pull fails."""
    consumer = with_connector(engines, "kv_both")
    params = {"do_remote_prefill": True, "remote_block_ids": [[1]], "remote_engine_id": "x",
              "remote_request_id": "r", "remote_host": "127.0.0.1", "remote_port": "nope"}
    reply = decode(consumer, params)
    assert (reply.status, reply.json()) == (500, INTERNAL_ERROR)
    assert "Got invalid KVTransferParams" in consumer.log_text()
    assert get(consumer, "/health").status == 200


def by_source(text: str) -> dict[str, float]:
    return {source: metric(text, "vllm:prompt_tokens_by_source_total", source=source)
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer")}


@pytest.mark.parametrize(("prompt", "counted"), [
    ([5], {"local_compute": 1, "local_cache_hit": 0, "external_kv_transfer": 0}),
    (list(range(3, 43)), {"local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 40}),
], ids=["one-token", "forty-tokens"])
def test_pulled_prompt_tokens_are_counted_as_vllm_0_32_counts_them(
        engines: StartEngine, prompt: list[int], counted: dict[str, int]) -> None:
    """As the real tier measured: a 1-token prompt still moves its block over NIXL but is
    reported as local_compute; a longer one is external_kv_transfer token for token."""
    producer = with_connector(engines, "kv_both")
    consumer = with_connector(engines, "kv_both")
    first = post(producer, "/v1/completions", {
        "prompt": prompt, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}).json()
    before = get(consumer, "/metrics").body.decode()
    reply = post(consumer, "/v1/completions", {
        "prompt": prompt, "max_tokens": 4, "kv_transfer_params": first["kv_transfer_params"]})
    assert reply.status == 200, reply.body
    after = get(consumer, "/metrics").body.decode()
    moved = {k: v - by_source(before)[k] for k, v in by_source(after).items()}
    assert moved == counted
    for name, grew in (("vllm:nixl_xfer_time_seconds_count", 1),
                       ("vllm:prompt_tokens_cached_by_source_total", len(prompt))):
        labels = {"source": "p2p"} if "by_source" in name else {}
        assert metric(after, name, **labels) - metric(before, name, **labels) == grew


def test_a_failed_handoff_counts_one_failed_handshake_then_the_clean_up_attempt(
        engines: StartEngine) -> None:
    """vLLM fails the request on the first failed handshake, then hand-shakes once more to
    free the producer's blocks (logged with the plain request id and no local blocks), so
    vllm:nixl_num_failed_transfers_total ends at 2 for one failed handoff."""
    producer = with_connector(engines, "kv_both")
    consumer = with_connector(engines, "kv_both")
    params = {**prefill(producer)["kv_transfer_params"], "remote_engine_id": "no-such-engine"}
    reply = post(consumer, "/v1/completions", {"model": "tiny-llama", "prompt": PROMPT,
                                               "max_tokens": 4, "kv_transfer_params": params},
                 headers={"X-Request-Id": "handoff-7"})
    assert (reply.status, reply.json()) == (500, INTERNAL_ERROR)
    failed = "vllm:nixl_num_failed_transfers_total"
    assert wait_for(lambda: metric(get(consumer, "/metrics").body.decode(), failed) == 2)
    text = get(consumer, "/metrics").body.decode()
    assert metric(text, "vllm:request_success_total", finished_reason="error") == 1
    lines = [line for line in consumer.log_text().splitlines()
             if "NIXL transfer failure: handshake_failed" in line]
    assert len(lines) == 2
    assert "'request_id': 'cmpl-handoff-7-0-" in lines[0] and "'num_local_blocks': 1" in lines[0]
    assert "'request_id': 'handoff-7'" in lines[1] and "'num_local_blocks': 0" in lines[1]
    assert "Remote NIXL agent engine ID mismatch. Expected no-such-engine," in consumer.log_text()


def test_a_dead_prefiller_is_http_500_and_the_consumer_stays_healthy(
        engines: StartEngine) -> None:
    """The reference's dead-prefiller case: P dies between its prefill and D's pull."""
    producer = with_connector(engines, "kv_both")
    consumer = with_connector(engines, "kv_both")
    assert decode(consumer, prefill(producer)["kv_transfer_params"]).status == 200
    params = prefill(producer)["kv_transfer_params"]
    producer.stop()
    reply = decode(consumer, params)
    assert (reply.status, reply.json()) == (500, INTERNAL_ERROR)
    assert "NIXL_ERR_REMOTE_DISCONNECT" in consumer.log_text()
    streamed = decode(consumer, params, stream=True)
    assert streamed.status == 200
    assert streamed.events() == [INTERNAL_ERROR, "[DONE]"]
    text = get(consumer, "/metrics").body.decode()
    assert metric(text, "vllm:nixl_num_failed_transfers_total") >= 2
    assert decode(consumer, None).status == 200


def test_recompute_policy_serves_a_failed_load_locally(engines: StartEngine) -> None:
    consumer = with_connector(engines, "kv_consumer", kv_load_failure_policy="recompute")
    params = {"do_remote_prefill": True, "remote_block_ids": [[1]], "remote_engine_id": "gone",
              "remote_request_id": "r", "remote_host": "127.0.0.1", "remote_port": free_port(),
              "tp_size": 1}
    assert decode(consumer, params).status == 200


def test_a_missing_connector_module_fails_startup_naming_the_flag(engines: StartEngine) -> None:
    config = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    with pytest.raises(Exception, match=r"--kv-transfer-config: the KV connector"):
        engines("--kv-transfer-config", config, "--emu-connector-factory", "no.such:thing")


@pytest.mark.parametrize(("producer_args", "consumer_args", "message"), [
    (("--dtype", "bfloat16"), ("--dtype", "float32"), "NIXL compatibility hash mismatch"),
    (("--kv-cache-dtype", "fp8"), (), "NIXL compatibility hash mismatch"),
    ((), ("MODEL_ELSEWHERE",), "NIXL compatibility hash mismatch"),
    (("--block-size", "64"), ("--block-size", "32"),  # vLLM 0.32 CPU_ATTN: multiples of 32
     "Local block size 32 is not divisible by remote block size 64"),
], ids=["dtype", "kv-cache-dtype", "model-string", "block-size"])
def test_a_handshake_between_different_plans_fails_with_vllms_message(
        engines: StartEngine, tmp_path: Any, producer_args: tuple[str, ...],
        consumer_args: tuple[str, ...], message: str) -> None:
    """The consumer refuses the producer's KV at the handshake, naming both hashes (or, for a
    factor outside the hash, the runtime check vLLM applies after it), and the request fails."""
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                     "kv_buffer_device": "cpu"})
    base = [a for a in COMMON if a not in ("--dtype", "float32")]

    def start(args: tuple[str, ...]) -> RunningEngine:
        if args == ("MODEL_ELSEWHERE",):  # another --model string: the same files elsewhere
            model = write_tiny_llama(tmp_path / "elsewhere" / "tiny-llama")
            return engines(*base, "--kv-transfer-config", kv, env=LOOPBACK, model=model)
        return engines(*base, *args, "--kv-transfer-config", kv, env=LOOPBACK)

    producer, consumer = start(producer_args), start(consumer_args)
    params = prefill(producer)["kv_transfer_params"]
    reply = decode(consumer, params)
    assert (reply.status, reply.json()) == (500, INTERNAL_ERROR)
    log = consumer.log_text()
    assert message in log
    if "hash mismatch" in message:
        hashes = re.search(r"Local: ([0-9a-f]{64}), Remote: ([0-9a-f]{64})", log)
        assert hashes is not None and hashes[1] != hashes[2]
