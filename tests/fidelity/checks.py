"""Client-visible facts of a vLLM 0.32.0 engine, as checks that run against any engine URL.

Each check takes base URLs (`http://127.0.0.1:PORT`), sends the same requests the captures in
tests/fixtures/vllm-0.32.0 were taken with, and asserts what a client would notice: status
codes, content types, key sets and JSON kinds at every level, usage arithmetic, metric names
and labels, the `kv_transfer_params` a producer returns and the error bodies. A failure lists
every difference at once, with its path, so an emulator can be fixed from the message alone.

The same checks run in tests/real (against real vLLM, which also proves the captures are
current) and in tests/component (against the emulator).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from narwhal.core.kv.capture.endpoints import (
    parse_cache_config_info,
    parse_process_start_time,
    parse_version_reply,
)
from narwhal.core.kv.versions import facts_for
from tests.fidelity import client, reference
from tests.fidelity import requests as rq
from tests.fidelity.shapes import kind, shape_diff

TOP_LOGPROBS = frozenset({"$.choices[].logprobs.top_logprobs[]"})
BOGUS_ENGINE_ID = "no-such-engine"


class FidelityError(AssertionError):
    """An engine answered differently from real vLLM; the message lists every difference."""


def _require(what: str, problems: list[str]) -> None:
    if problems:
        raise FidelityError(f"{what}: {len(problems)} difference(s) from vLLM 0.32.0:\n  - "
                            + "\n  - ".join(problems))


def _status(reply: client.Reply, want: int, what: str) -> list[str]:
    if reply.status == want:
        return []
    return [f"{what}: HTTP {reply.status}, vLLM answers {want} (body {reply.text[:200]!r})"]


def _expect(reply: client.Reply, want: int, what: str) -> list[str]:
    """A success path: a wrong status ends the check at once (shapes of an error body would
    only bury the one difference that matters)."""
    _require(what, _status(reply, want, what))
    return []


def _json(reply: client.Reply, what: str) -> Any:
    if not reply.content_type.startswith("application/json"):
        raise FidelityError(f"{what}: content-type {reply.content_type!r}, vLLM sends "
                            "application/json")
    try:
        return reply.json()
    except ValueError:
        raise FidelityError(f"{what}: body is not JSON: {reply.text[:200]!r}") from None


def _same_shape(what: str, want: Any, got: Any) -> list[str]:
    return [f"{what} {d}" for d in shape_diff(want, got, free_maps=TOP_LOGPROBS)]


def check_health(base: str) -> None:
    """GET /health answers 200 (load balancers and our waiters poll it)."""
    _require("GET /health", _status(client.get(f"{base}/health"), 200, "GET /health"))


def check_version(base: str) -> str:
    """GET /version is `{"version": "<vLLM version>"}`; the value is hash factor 1."""
    reply = client.get(f"{base}/version")
    problems = _expect(reply, 200, "GET /version")
    body = _json(reply, "GET /version")
    problems += _same_shape("GET /version", reference.document("version.json"), body)
    _require("GET /version", problems)
    return parse_version_reply(reply.body)


def check_models(base: str, model: str = rq.SERVED_NAME) -> None:
    """GET /v1/models lists the served name with vLLM's model card keys."""
    reply = client.get(f"{base}/v1/models")
    problems = _expect(reply, 200, "GET /v1/models")
    body = _json(reply, "GET /v1/models")
    problems += _same_shape("GET /v1/models", reference.document("models.json"), body)
    ids = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)]
    if model not in ids:
        problems.append(f"GET /v1/models lists {ids}, expected the served name {model!r}")
    _require("GET /v1/models", problems)


def check_tokenize(base: str, model: str = rq.SERVED_NAME) -> None:
    """POST /tokenize and /detokenize answer with vLLM's keys; count equals len(tokens)."""
    reply = client.post(f"{base}/tokenize", {"model": model, "prompt": rq.PROMPT})
    problems = _expect(reply, 200, "POST /tokenize")
    body = _json(reply, "POST /tokenize")
    problems += _same_shape("POST /tokenize", reference.document("tokenize.json"), body)
    if isinstance(body.get("tokens"), list) and body.get("count") != len(body["tokens"]):
        problems.append(f"POST /tokenize: count {body.get('count')} != {len(body['tokens'])} "
                        "tokens")
    tokens = body.get("tokens") or [1]
    back = client.post(f"{base}/detokenize", {"model": model, "tokens": tokens[:3]})
    problems += _expect(back, 200, "POST /detokenize")
    problems += _same_shape("POST /detokenize", reference.document("detokenize.json"),
                            _json(back, "POST /detokenize"))
    _require("POST /tokenize, /detokenize", problems)


def _usage(what: str, usage: Any, max_tokens: int) -> list[str]:
    if not isinstance(usage, dict):
        return [f"{what}: usage is {kind(usage)}"]
    problems = []
    prompt, completion, total = (usage.get(k) for k in
                                 ("prompt_tokens", "completion_tokens", "total_tokens"))
    if isinstance(prompt, int) and isinstance(completion, int) and total != prompt + completion:
        problems.append(f"{what}: usage total_tokens {total} != {prompt} + {completion}")
    if isinstance(completion, int) and not 0 < completion <= max_tokens:
        problems.append(f"{what}: usage completion_tokens {completion} for max_tokens "
                        f"{max_tokens}")
    return problems


def check_completion(base: str, model: str = rq.SERVED_NAME) -> None:
    """POST /v1/completions (no stream): vLLM's keys, null kv_transfer_params, usage adds up."""
    reply = client.post(f"{base}/v1/completions", rq.completion(model=model))
    problems = _expect(reply, 200, "POST /v1/completions")
    body = _json(reply, "POST /v1/completions")
    problems += _same_shape("POST /v1/completions", reference.document("completion.json"), body)
    problems += _usage("POST /v1/completions", body.get("usage"), rq.MAX_TOKENS)
    _require("POST /v1/completions", problems)


def check_chat(base: str, model: str = rq.SERVED_NAME) -> None:
    """POST /v1/chat/completions (no stream): vLLM's message and usage keys."""
    reply = client.post(f"{base}/v1/chat/completions", rq.chat(model=model))
    problems = _expect(reply, 200, "POST /v1/chat/completions")
    body = _json(reply, "POST /v1/chat/completions")
    problems += _same_shape("POST /v1/chat/completions", reference.document("chat.json"), body)
    problems += _usage("POST /v1/chat/completions", body.get("usage"), rq.MAX_TOKENS)
    _require("POST /v1/chat/completions", problems)


def _stream_parts(chunks: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
    """First chunk, a middle content chunk, the finishing chunk and the usage chunk."""
    with_choices = [c for c in chunks if c.get("choices")]
    finishing = [c for c in with_choices if c["choices"][0].get("finish_reason") is not None]
    parts: dict[str, Any] = {
        "first chunk": with_choices[0] if with_choices else None,
        "finishing chunk": finishing[0] if finishing else None,
        "usage chunk": next((c for c in chunks if not c.get("choices") and "usage" in c), None),
    }
    middle = with_choices[1:-1] if len(with_choices) > 2 else []
    parts["middle chunk"] = middle[0] if middle else None
    return parts


def _check_stream(what: str, url: str, body: dict[str, Any], captured: str) -> None:
    reply = client.post(url, body)
    problems = _expect(reply, 200, what)
    if not reply.content_type.startswith("text/event-stream"):
        problems.append(f"{what}: content-type {reply.content_type!r}, vLLM sends "
                        "text/event-stream")
    events = client.sse_events(reply.text)
    if not events or events[-1] != "[DONE]":
        problems.append(f"{what}: stream does not end with 'data: [DONE]' (last event "
                        f"{events[-1:]!r})")
        _require(what, problems)
    try:
        chunks = [json.loads(e) for e in events[:-1]]
    except ValueError as exc:
        raise FidelityError(f"{what}: an SSE event is not JSON ({exc})") from None
    want = _stream_parts(reference.stream(captured))
    got = _stream_parts(chunks)
    for part, sample in want.items():
        if sample is None:
            continue
        if got[part] is None:
            problems.append(f"{what}: no {part} (vLLM sends one)")
            continue
        problems += _same_shape(f"{what} {part}", sample, got[part])
    if got["usage chunk"] is not None:
        problems += _usage(what, got["usage chunk"].get("usage"), rq.MAX_TOKENS)
    ids = {c.get("id") for c in chunks}
    if len(ids) != 1:
        problems.append(f"{what}: chunks carry {len(ids)} different ids, vLLM uses one")
    _require(what, problems)


def check_completion_stream(base: str, model: str = rq.SERVED_NAME) -> None:
    """Streamed completions: SSE chunks shaped like vLLM's, usage chunk, then [DONE]."""
    _check_stream("POST /v1/completions stream", f"{base}/v1/completions",
                  rq.completion(model=model, **rq.STREAM), "completion-stream.sse")


def check_chat_stream(base: str, model: str = rq.SERVED_NAME) -> None:
    """Streamed chat: role chunk first, content deltas, finish, usage chunk, then [DONE]."""
    _check_stream("POST /v1/chat/completions stream", f"{base}/v1/chat/completions",
                  rq.chat(model=model, **rq.STREAM), "chat-stream.sse")


def check_metrics(base: str) -> None:
    """/metrics: every vllm:* sample of real vLLM with its label names, the full
    cache_config_info label set, and a process start time."""
    reply = client.get(f"{base}/metrics")
    problems = _expect(reply, 200, "GET /metrics")
    if not reply.content_type.startswith("text/plain"):
        problems.append(f"GET /metrics: content-type {reply.content_type!r}, vLLM sends "
                        "text/plain")
    got = reference.metric_samples(reply.text)
    for name, labels in sorted(reference.vllm_metric_samples().items()):
        if name.endswith("_created"):
            continue  # prometheus_client's creation timestamps: no client reads them
        if name not in got:
            problems.append(f"GET /metrics: missing sample {name}")
        elif name != "vllm:cache_config_info" and got[name] != labels:
            problems.append(f"GET /metrics: {name} has labels {sorted(got[name])}, vLLM "
                            f"{sorted(labels)}")
    want_labels = reference.cache_config_labels()
    try:
        infos = parse_cache_config_info(reply.text)
        parse_process_start_time(reply.text)
    except Exception as exc:  # ContractError: the parser's own message says what is missing
        problems.append(f"GET /metrics: {exc}")
        infos = []
    for info in infos:
        have = set(info.labels)
        problems += [f"GET /metrics: vllm:cache_config_info lacks label {k!r}"
                     for k in sorted(want_labels - have)]
        problems += [f"GET /metrics: vllm:cache_config_info has extra label {k!r}"
                     for k in sorted(have - want_labels)]
    _require("GET /metrics", problems)


def check_wrong_model(base: str, model: str = rq.SERVED_NAME) -> None:
    """A request for a model the engine does not serve: 404 NotFoundError naming both names."""
    reply = client.post(f"{base}/v1/completions", rq.completion(model="no-such-model"))
    problems = _status(reply, 404, "wrong model")
    body = _json(reply, "wrong model")
    want = reference.document("error-wrong-model.json")
    want = {"error": {**want["error"], "message": want["error"]["message"].replace(
        rq.SERVED_NAME, model)}}
    if body != want:
        problems.append(f"wrong model: body {body!r}, vLLM {want!r}")
    _require("wrong model", problems)


def check_bad_request(base: str, model: str = rq.SERVED_NAME) -> None:
    """An invalid sampling value: 400 BadRequestError naming the parameter."""
    reply = client.post(f"{base}/v1/completions", rq.completion(model=model, max_tokens=-1))
    problems = _status(reply, 400, "max_tokens -1")
    body = _json(reply, "max_tokens -1")
    want = reference.document("error-bad-max-tokens.json")
    if body != want:
        problems.append(f"max_tokens -1: body {body!r}, vLLM {want!r}")
    _require("max_tokens -1", problems)


def check_unknown_routes(base: str) -> None:
    """Unknown path: 404 {"detail": "Not Found"}; wrong method: 405 (FastAPI's bodies)."""
    problems: list[str] = []
    for what, reply, code, captured in (
        ("GET /no/such/route", client.get(f"{base}/no/such/route"), 404,
         "error-not-found.json"),
        ("POST /v1/models", client.post(f"{base}/v1/models", {}), 405,
         "error-method-not-allowed.json"),
    ):
        problems += _status(reply, code, what)
        want = reference.document(captured)
        try:
            body = reply.json()
        except ValueError:
            body = reply.text
        if body != want:
            problems.append(f"{what}: body {body!r}, vLLM {want!r}")
    _require("unknown routes", problems)


def prefill(p_base: str, prompt: str = rq.HANDOFF_PROMPT,
            model: str = rq.SERVED_NAME) -> tuple[dict[str, Any], list[str]]:
    """Run the producer leg: its kv_transfer_params and every way the reply differs from vLLM
    (keys, order-free, and types). Raises only when there are no params to hand over."""
    reply = client.post(f"{p_base}/v1/completions", rq.prefill(prompt, model))
    problems = _expect(reply, 200, "prefill")
    body = _json(reply, "prefill")
    problems += _same_shape("prefill", reference.document("prefill-reply.json"), body)
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict):
        _require("prefill", [*problems, f"prefill: kv_transfer_params is {kind(params)}"])
    want_keys = facts_for("0.32.0").kv_transfer_params_keys
    problems += [f"prefill: kv_transfer_params lacks {k!r}" for k in want_keys
                 if k not in params]
    problems += [f"prefill: kv_transfer_params has unexpected {k!r}" for k in params
                 if k not in want_keys]
    fixed = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_mode": "pull",
             "remote_blocks_expiry_time": None}
    problems += [f"prefill: kv_transfer_params {k} is {params.get(k)!r}, vLLM sends {v!r}"
                 for k, v in fixed.items() if params.get(k) != v]
    problems += _param_types(params)
    return dict(params), problems


def _param_types(params: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("remote_engine_id", "remote_request_id", "remote_host"):
        if not isinstance(params.get(key), str) or not params.get(key):
            problems.append(f"prefill: {key} is {params.get(key)!r}, expected a string")
    for key in ("remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens",
                "remote_prefill_cached_tokens"):
        value = params.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"prefill: {key} is {value!r}, expected an integer")
    blocks = params.get("remote_block_ids")
    if not (isinstance(blocks, list) and blocks and all(
            isinstance(g, list) and g and all(isinstance(b, int) for b in g) for g in blocks)):
        problems.append(f"prefill: remote_block_ids is {blocks!r}, expected a non-empty list "
                        "of lists of block ids (one per KV cache group)")
    return problems


def check_prefill_params(p_base: str, d_base: str, model: str = rq.SERVED_NAME) -> None:
    """The producer's kv_transfer_params carry every pull-mode key with vLLM's types."""
    del d_base  # a pair check by signature; only the producer is asked
    _require("prefill", prefill(p_base, model=model)[1])


def check_handoff(p_base: str, d_base: str, model: str = rq.SERVED_NAME) -> None:
    """P's params, passed to D, give a 200 completion shaped like vLLM's (logprobs included).
    The prefill reply's own differences are check_prefill_params' to report."""
    params, _ = prefill(p_base, model=model)
    reply = client.post(f"{d_base}/v1/completions",
                        rq.completion(rq.HANDOFF_PROMPT, model, logprobs=1,
                                      kv_transfer_params=params))
    problems = _expect(reply, 200, "decode with P's params")
    body = _json(reply, "decode with P's params")
    problems += _same_shape("decode with P's params", reference.document("decode-reply.json"),
                            body)
    _require("handoff", problems)


def check_failed_handoff(p_base: str, d_base: str, model: str = rq.SERVED_NAME) -> None:
    """D given params naming an engine it cannot reach: HTTP 500 with vLLM's exact error body."""
    params, _ = prefill(p_base, rq.PROMPT, model=model)
    bogus = {**params, "remote_engine_id": BOGUS_ENGINE_ID}
    began = time.monotonic()
    reply = client.post(f"{d_base}/v1/completions",
                        rq.completion(model=model, kv_transfer_params=bogus))
    problems = _status(reply, 500, "failed handoff")
    body = _json(reply, "failed handoff")
    want = reference.document("error-failed-handoff.json")
    if body != want:
        problems.append(f"failed handoff: body {body!r}, vLLM {want!r}")
    if time.monotonic() - began > 30:
        problems.append("failed handoff: took over 30 s; vLLM fails it within a second")
    _require("failed handoff", problems)


SINGLE_ENGINE_CHECKS: tuple[Callable[..., Any], ...] = (
    check_health, check_version, check_models, check_tokenize, check_completion, check_chat,
    check_completion_stream, check_chat_stream, check_metrics, check_wrong_model,
    check_bad_request, check_unknown_routes,
)
PAIR_CHECKS: tuple[Callable[..., Any], ...] = (
    check_prefill_params, check_handoff, check_failed_handoff,
)
