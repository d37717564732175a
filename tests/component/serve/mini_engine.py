"""A small OpenAI-route engine for router tests, run as its own process on loopback.

It answers a prefill leg (`kv_transfer_params.do_remote_decode`) with one token and a
producer-shaped `kv_transfer_params` holding awkward values (nested lists, unicode, a float,
null), so a test can prove the decode engine received them unchanged. Every POST body and its
x-request-id are appended to `--record` as JSON lines. Faults are real: `--crash-after N` ends
the process with os._exit after N streamed events of a decode leg; `--decode-status S` answers
every decode leg with HTTP S; `--first-token-delay-ms` holds the first event back and
`--stall-after N` goes silent after N events; `--no-kv` answers prefill legs like an engine started without
a KV connector.

    python -m tests.component.serve.mini_engine --port P --id NAME --record FILE [...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from aiohttp import web

ARGS = argparse.Namespace()


def _record(request: web.Request, body: Any, produced: Any = None) -> None:
    with open(ARGS.record, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"engine": ARGS.id, "path": request.path,
                             "x_request_id": request.headers.get("x-request-id"),
                             "body": body, "produced": produced}) + "\n")


def producer_params(n_prompt: int) -> dict[str, Any]:
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [[1, 2, 3], [7]],
        "remote_engine_id": f"{ARGS.id}-engine-ü",
        "remote_request_id": f"cmpl-{ARGS.id}-{time.monotonic_ns()}",
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "tp_size": 1,
        "remote_num_tokens": n_prompt,
        "remote_blocks_expiry_time": None,
        "kv_scale": 0.125,
        "transfer_mode": "pull",
    }


def _prompt_len(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"]) + 3
    prompt = body.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt).split()))


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    chat = request.path.endswith("/chat/completions")
    n_prompt = _prompt_len(body)
    kv = body.get("kv_transfer_params") or {}
    wanted = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    if ARGS.max_model_len and n_prompt + wanted > ARGS.max_model_len:
        _record(request, body, "refused: context")
        return web.json_response({"error": {
            "message": f"You passed {n_prompt} input tokens and requested {wanted} output "
                       f"tokens. However, the model's context length is only "
                       f"{ARGS.max_model_len} tokens.", "type": "BadRequestError",
            "param": "input_tokens", "code": 400}}, status=400)
    head = {"id": f"cmpl-{ARGS.id}-{time.monotonic_ns()}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": body.get("model", ARGS.model)}
    if kv.get("do_remote_decode"):
        produced = producer_params(n_prompt)
        _record(request, body, produced)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": "x"}
        else:
            choice["text"] = "x"
        return web.json_response({
            **head, "object": "chat.completion" if chat else "text_completion",
            "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": 1,
                      "total_tokens": n_prompt + 1},
            "kv_transfer_params": None if ARGS.no_kv else produced})
    _record(request, body)
    if ARGS.decode_status:
        return web.json_response({"error": {"message": "engine refuses on purpose",
                                            "type": "server_error", "param": None,
                                            "code": ARGS.decode_status}},
                                 status=ARGS.decode_status)
    n_out = body.get("max_completion_tokens") or body.get("max_tokens") or 8
    texts = [f" tok{k}" for k in range(n_out)]
    if not body.get("stream"):
        text = "".join(texts)
        choice = {"index": 0, "finish_reason": "length", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return web.json_response({**head, "choices": [choice], "usage": {
            "prompt_tokens": n_prompt, "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out}})
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    if ARGS.kv_fails and kv.get("do_remote_prefill"):  # vLLM's streamed KV load failure
        await resp.write(b'data: {"error": {"message": "Internal server error", '
                         b'"type": "InternalServerError", "param": null, "code": 500}}\n\n'
                         b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    if ARGS.first_token_delay_ms:
        await asyncio.sleep(ARGS.first_token_delay_ms / 1000)
    for k, text in enumerate(texts):
        if ARGS.stall_after is not None and k == ARGS.stall_after:
            await asyncio.sleep(3600)
        if ARGS.crash_after is not None and k >= ARGS.crash_after:
            os._exit(17)
        last = k == n_out - 1
        if chat:
            delta: dict[str, Any] = {"content": text}
            if k == 0:
                delta["role"] = "assistant"
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": "length" if last else None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": "length" if last else None, "stop_reason": None}
        await resp.write(b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n")
        if ARGS.token_gap_ms:
            await asyncio.sleep(ARGS.token_gap_ms / 1000)
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {**head, "choices": [], "usage": {"prompt_tokens": n_prompt,
                                                   "completion_tokens": n_out,
                                                   "total_tokens": n_prompt + n_out}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def tokenize(request: web.Request) -> web.Response:
    body = await request.json()
    _record(request, body)
    n = _prompt_len(body)
    return web.json_response({"count": n, "max_model_len": ARGS.max_model_len or 4096,
                              "tokens": list(range(n)),
                              "token_strs": None})


async def models(_request: web.Request) -> web.Response:
    card: dict[str, Any] = {"id": ARGS.model, "object": "model", "owned_by": "vllm"}
    if ARGS.max_model_len:
        card["max_model_len"] = ARGS.max_model_len
    return web.json_response({"object": "list", "data": [card]})


async def detokenize(request: web.Request) -> web.Response:
    body = await request.json()
    _record(request, body)
    return web.json_response({"prompt": " ".join(f"t{t}" for t in body.get("tokens", []))})


async def health(_request: web.Request) -> web.Response:
    return web.Response(status=200)


STARTED = time.time()


async def version(_request: web.Request) -> web.Response:
    return web.json_response({"version": ARGS.engine_version})


async def metrics(_request: web.Request) -> web.Response:
    """Just the line generation binding reads, as prometheus_client writes it."""
    return web.Response(text=f"# TYPE process_start_time_seconds gauge\n"
                             f"process_start_time_seconds {STARTED!r}\n")


def main() -> None:
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--model", default="mini-model")
    p.add_argument("--crash-after", type=int)
    p.add_argument("--decode-status", type=int, default=0)
    p.add_argument("--token-gap-ms", type=float, default=0.0)
    p.add_argument("--no-kv", action="store_true", help="answer prefill legs without KV params")
    p.add_argument("--kv-fails", action="store_true",
                   help="a decode leg with KV params streams 200 then an error event")
    p.add_argument("--first-token-delay-ms", type=float, default=0.0)
    p.add_argument("--stall-after", type=int, help="stop sending (but stay up) after N events")
    p.add_argument("--engine-version", default="mini-1", help="what GET /version says")
    p.add_argument("--max-model-len", type=int, default=0,
                   help="context length: /v1/models says it and longer requests get a 400")
    ARGS = p.parse_args()
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=ARGS.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
