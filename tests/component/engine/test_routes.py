"""Every route a vLLM client uses, answered by a real emulator process with vLLM's shapes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.kv.capture.endpoints import parse_cache_config_info, parse_process_start_time
from narwhal.lab.engine.testing import RunningEngine, start_engine
from tests.component.engine.client import call, get, metric, post

pytestmark = pytest.mark.timeout(120)
REAL = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32.0"
PROMPT = "the people of the world were right about the water"


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    log = tmp_path_factory.mktemp("logs") / "engine.log"
    running = start_engine(tiny_model, log_path=log, extra_args=(
        "--served-model-name", "tiny-llama", "alias", "--max-model-len", "512",
        "--dtype", "float32", "--emu-platform", "cpu", "--emu-zero-delay",
        "--enable-request-id-headers"), env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        yield running
    finally:
        running.stop()


def completion(engine: RunningEngine, **body: Any) -> dict[str, Any]:
    reply = post(engine, "/v1/completions", {"model": "tiny-llama", "prompt": PROMPT, **body})
    assert reply.status == 200, reply.body
    data: dict[str, Any] = reply.json()
    return data


def test_health_version_and_models(engine: RunningEngine, tiny_model: Path) -> None:
    health = get(engine, "/health")
    assert (health.status, health.body) == (200, b"")
    assert get(engine, "/version").json() == {"version": "0.32.0"}  # DEFAULT_VLLM_VERSION
    models = get(engine, "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tiny-llama", "alias"]
    card = models["data"][0]
    assert (card["root"], card["max_model_len"], card["owned_by"]) == (str(tiny_model), 512,
                                                                       "vllm")
    assert card["object"] == "model" and card["permission"][0]["object"] == "model_permission"


def test_tokenize_counts_bos_and_detokenize_inverts_it(engine: RunningEngine) -> None:
    tok = post(engine, "/tokenize", {"model": "tiny-llama", "prompt": PROMPT}).json()
    assert set(tok) == {"count", "max_model_len", "tokens", "token_strs"}
    assert tok["count"] == len(tok["tokens"]) and tok["tokens"][0] == 0
    assert (tok["max_model_len"], tok["token_strs"]) == (512, None)
    plain = post(engine, "/tokenize", {"prompt": PROMPT, "add_special_tokens": False,
                                       "return_token_strs": True}).json()
    assert plain["tokens"] == tok["tokens"][1:]
    assert "".join(plain["token_strs"]) == PROMPT
    assert post(engine, "/detokenize", {"tokens": tok["tokens"]}).json() == {"prompt": PROMPT}
    chat = post(engine, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"][0] == 0 and chat["count"] == len(chat["tokens"])


def test_completion_has_vllm_shape_and_null_kv_params(engine: RunningEngine) -> None:
    body = completion(engine, model="alias", max_tokens=5, ignore_eos=True)
    assert list(body) == ["id", "object", "created", "model", "choices", "service_tier",
                          "system_fingerprint", "usage", "kv_transfer_params",
                          "ec_transfer_params", "metrics"]  # vLLM 0.32.0's order
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["model"] == "tiny-llama"  # responses carry the first served name
    assert body["kv_transfer_params"] is None
    assert re.fullmatch(r"vllm-0\.32\.0-[0-9a-f]{8}", body["system_fingerprint"])
    choice = body["choices"][0]
    assert list(choice) == ["index", "text", "logprobs", "finish_reason", "stop_reason",
                            "token_ids", "prompt_logprobs", "prompt_token_ids", "routed_experts"]
    assert choice["finish_reason"] == "length" and choice["token_ids"] is None
    usage = body["usage"]
    prompt_len = post(engine, "/tokenize", {"prompt": PROMPT}).json()["count"]
    assert usage == {"prompt_tokens": prompt_len, "total_tokens": prompt_len + 5,
                     "completion_tokens": 5, "prompt_tokens_details": None,
                     "completion_tokens_details": None}
    again = completion(engine, max_tokens=1)
    assert again["system_fingerprint"] == body["system_fingerprint"]  # fixed per engine


def test_return_token_ids_and_the_same_prompt_gives_the_same_tokens(
        engine: RunningEngine) -> None:
    one = completion(engine, max_tokens=12, ignore_eos=True, return_token_ids=True)
    two = completion(engine, max_tokens=12, ignore_eos=True, return_token_ids=True)
    tokens = post(engine, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    for body in (one, two):
        assert body["choices"][0]["prompt_token_ids"] == tokens
        assert len(body["choices"][0]["token_ids"]) == 12
    assert one["choices"][0]["token_ids"] == two["choices"][0]["token_ids"]
    assert one["choices"][0]["text"] == two["choices"][0]["text"]
    detok = post(engine, "/detokenize", {"tokens": one["choices"][0]["token_ids"]}).json()
    assert detok["prompt"] == one["choices"][0]["text"]


def test_streamed_completion_matches_the_unstreamed_one_and_ends_with_usage(
        engine: RunningEngine) -> None:
    full = completion(engine, max_tokens=9, ignore_eos=True, return_token_ids=True)
    reply = post(engine, "/v1/completions", {
        "model": "tiny-llama", "prompt": PROMPT, "max_tokens": 9, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True})
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events[-1] == "[DONE]"
    usage, chunks = events[-2], events[:-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 9
    assert set(usage["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens"}
    assert usage["system_fingerprint"].startswith("vllm-0.32.0-")
    assert all(c["object"] == "text_completion" and c["id"] == usage["id"] for c in chunks)
    choices = [c["choices"][0] for c in chunks]
    assert "".join(c["text"] for c in choices) == full["choices"][0]["text"]
    assert [t for c in choices for t in c["token_ids"]] == full["choices"][0]["token_ids"]
    assert choices[0]["prompt_token_ids"] == full["choices"][0]["prompt_token_ids"]
    assert all(c["prompt_token_ids"] is None for c in choices[1:])
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]


def test_stream_interval_batches_tokens_per_chunk(engine: RunningEngine) -> None:
    reply = post(engine, "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "stream": True,
        "stream_interval": 4, "return_token_ids": True})
    sizes = [len(e["choices"][0]["token_ids"]) for e in reply.events()[:-1]]
    assert sum(sizes) == 10
    assert len(sizes) <= 4  # the first token at once, then at most every 4 (late ones coalesce)


def test_chat_completion_streamed_and_not(engine: RunningEngine) -> None:
    messages = [{"role": "user", "content": "the world"}]
    full = post(engine, "/v1/chat/completions", {
        "model": "tiny-llama", "messages": messages, "max_completion_tokens": 6,
        "ignore_eos": True, "return_token_ids": True}).json()
    assert full["id"].startswith("chatcmpl-") and full["object"] == "chat.completion"
    assert {"prompt_token_ids", "kv_transfer_params", "usage", "prompt_logprobs"} <= set(full)
    message = full["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]
    assert len(full["choices"][0]["token_ids"]) == 6
    events = post(engine, "/v1/chat/completions", {
        "model": "tiny-llama", "messages": messages, "max_tokens": 6, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}}).events()
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"]["content"] for e in events[1:-2]]
    assert "".join(deltas) == message["content"]
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 6 and events[-1] == "[DONE]"
    assert (full["prompt_text"], events[0]["prompt_text"]) == (None, None)


def test_chat_returns_the_rendered_prompt_only_when_asked(engine: RunningEngine) -> None:
    body = {"messages": [{"role": "user", "content": "the world"}], "max_tokens": 2,
            "return_prompt_text": True}
    full = post(engine, "/v1/chat/completions", body).json()
    assert full["prompt_text"] == "<s>user: the world</s>\n<s>assistant: "  # the template
    first = post(engine, "/v1/chat/completions", {**body, "stream": True}).events()[0]
    assert first["prompt_text"] == full["prompt_text"]


def test_logprobs_in_both_shapes_are_deterministic(engine: RunningEngine) -> None:
    one = completion(engine, max_tokens=3, ignore_eos=True, logprobs=2)
    two = completion(engine, max_tokens=3, ignore_eos=True, logprobs=2)
    lp = one["choices"][0]["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert len(lp["tokens"]) == 3 and all(len(t) == 2 for t in lp["top_logprobs"])
    assert lp == two["choices"][0]["logprobs"]
    chat = post(engine, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "ignore_eos": True,
        "logprobs": True, "top_logprobs": 3}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and len(content[0]["top_logprobs"]) == 3
    assert content[0]["top_logprobs"][0]["token"] == content[0]["token"]


def test_x_request_id_names_the_response(engine: RunningEngine) -> None:
    reply = post(engine, "/v1/completions", {"prompt": "hi", "max_tokens": 1},
                 headers={"X-Request-Id": "rid-123-a1-prefill"})
    assert reply.json()["id"] == "cmpl-rid-123-a1-prefill"
    assert reply.headers["x-request-id"] == "cmpl-rid-123-a1-prefill"


@pytest.mark.parametrize(("body", "status", "err_type", "fragment"), [
    ({"model": "nope", "prompt": "x"}, 404, "NotFoundError",
     "The model `nope` does not exist. Valid aliases: tiny-llama, alias."),
    ({"prompt": "x", "max_tokens": "many"}, 400, "Bad Request", "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, 400, "BadRequestError",
     "max_tokens must be at least 1, got 0."),
    ({"prompt": "x", "n": 2}, 400, "BadRequestError", "parameter=n"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "Bad Request",
     "Stream options can only be defined when `stream=True`."),
    ({"prompt": ""}, 400, "Bad Request", "prompt"),
    ({"prompt": [5, 9999]}, 400, "BadRequestError", "Token id 9999 is out of vocabulary"),
    ({"prompt": "x", "logprobs": 50}, 400, "BadRequestError", "greater than max allowed: 20"),
    ({"prompt": "x", "max_tokens": 4, "min_tokens": 5}, 400, "BadRequestError", "min_tokens"),
])
def test_bad_completion_bodies_get_vllm_error_shapes(engine: RunningEngine, body: dict[str, Any],
                                                    status: int, err_type: str,
                                                    fragment: str) -> None:
    reply = post(engine, "/v1/completions", body)
    assert reply.status == status
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["type"] == err_type
    assert fragment in error["message"]


def test_invalid_json_and_non_object_bodies_are_400(engine: RunningEngine) -> None:
    for raw in (b"{not json", b"[1, 2]"):
        reply = call(engine, "POST", "/v1/chat/completions", raw=raw)
        assert reply.status == 400 and reply.json()["error"]["type"] == "Bad Request"
    missing = post(engine, "/v1/chat/completions", {"model": "tiny-llama"})
    assert missing.status == 400 and "messages" in missing.json()["error"]["message"]


def test_a_prompt_longer_than_the_context_is_refused_with_vllm_wording(
        engine: RunningEngine) -> None:
    reply = post(engine, "/v1/completions", {"prompt": [5] * 600, "max_tokens": 16})
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["param"] == "input_tokens"
    assert error["message"].startswith("You passed 600 input tokens and requested 16 output "
                                       "tokens. However, the model's context length is only 512")
    chat = post(engine, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x" * 700}]})
    assert chat.status == 400 and "context length is only 512" in chat.json()["error"]["message"]


def test_unknown_paths_and_methods_answer_like_fastapi(engine: RunningEngine) -> None:
    missing = get(engine, "/v2/nothing")
    assert (missing.status, missing.json()) == (404, {"detail": "Not Found"})
    wrong = get(engine, "/v1/completions")
    assert (wrong.status, wrong.json()) == (405, {"detail": "Method Not Allowed"})


def test_metrics_have_every_cache_label_and_counters_move(engine: RunningEngine) -> None:
    before = get(engine, "/metrics").body.decode()
    completion(engine, max_tokens=4, ignore_eos=True)
    after = get(engine, "/metrics").body.decode()
    labels = parse_cache_config_info(after)[0].labels
    real = parse_cache_config_info((REAL / "metrics-idle.txt").read_text())[0].labels
    assert set(labels) == set(real)
    assert (labels["block_size"], labels["num_gpu_blocks"]) == ("128", "8192")
    assert parse_process_start_time(after) == parse_process_start_time(before)
    ids = {"model_name": "tiny-llama", "engine": "0"}
    for name, grew_by in (("vllm:generation_tokens_total", 4),
                          ("vllm:e2e_request_latency_seconds_count", 1)):
        assert metric(after, name, **ids) - metric(before, name, **ids) == grew_by
    assert metric(after, "vllm:prompt_tokens_total", **ids) > metric(
        before, "vllm:prompt_tokens_total", **ids)
    assert metric(after, "vllm:request_success_total", finished_reason="length", **ids) > \
        metric(before, "vllm:request_success_total", finished_reason="length", **ids)
    assert "vllm:nixl_" not in after
