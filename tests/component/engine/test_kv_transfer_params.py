"""kv_transfer_params over HTTP, as vLLM's pull mode accepts and returns them.

Every engine here runs the emulator's own NIXL connector: real side-channel handshakes and
real KV bytes over loopback TCP, so what is counted and returned is what a router would see.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from narwhal.lab.engine.testing import RunningEngine, free_port, write_tiny_llama
from tests.component.engine.client import get, metric, post
from tests.component.engine.conftest import StartEngine

pytestmark = pytest.mark.timeout(120)
PROMPT = "the people of the world were right about the water and the city"
INTERNAL_ERROR = {"error": {"message": "Internal server error", "type": "InternalServerError",
                            "param": None, "code": 500}}
COMMON = ("--served-model-name", "tiny-llama", "--kv-cache-memory-bytes", "64M",
          "--emu-platform", "cpu", "--dtype", "float32", "--max-model-len", "512")
LOOPBACK = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}


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


def test_invalid_params_are_logged_and_computed_locally(engines: StartEngine) -> None:
    consumer = with_connector(engines, "kv_both")
    reply = decode(consumer, {"do_remote_prefill": True, "remote_engine_id": "x"})
    assert reply.status == 200
    assert "Got invalid KVTransferParams" in consumer.log_text()
    text = get(consumer, "/metrics").body.decode()
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_compute") > 0


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
    (("--block-size", "32"), ("--block-size", "16"),
     "Local block size 16 is not divisible by remote block size 32"),
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
