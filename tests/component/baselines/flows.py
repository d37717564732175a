"""One routed request, checked end to end: the client's reply and what each engine did.

Shared by every baseline router's tests so that each router is held to the same claims: the
client sees vLLM's shapes; the prefill engine got exactly one request, with max_tokens=1
(vLLM's `request_params_max_tokens` histogram); the decode engine got the client's max_tokens
and loaded the prompt's KV from its peer (`external_kv_transfer`) rather than computing it. A
producer holds blocks for a pull only after a `do_remote_decode` request, so the pull is also
the evidence that the one-token leg carried `do_remote_decode`.
"""

from __future__ import annotations

from typing import Any

from tests.component.baselines import shapes
from tests.component.baselines.conftest import EnginePair
from tests.component.baselines.harness import post_json, sse_objects

ROUTES = [
    ("/v1/completions", False),
    ("/v1/completions", True),
    ("/v1/chat/completions", False),
    ("/v1/chat/completions", True),
]
ROUTE_IDS = ["completions", "completions-stream", "chat", "chat-stream"]
MAX_TOKENS = 8
# Long enough to span several KV blocks at the emulator's block size.
PROMPT = " ".join(f"word{k}" for k in range(48))


def request_body(model: str, endpoint: str, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS, "stream": stream}
    if endpoint == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _legs(engines: EnginePair) -> list[float]:
    return [engines.prefill.requests(), engines.prefill.one_token_requests(),
            engines.decode.requests(), engines.decode.one_token_requests()]


def assert_routed(router: str, engines: EnginePair, endpoint: str, stream: bool) -> None:
    chat = endpoint == "/v1/chat/completions"
    external_before = engines.decode.external_kv_tokens()
    before = _legs(engines)
    reply = post_json(f"{router}{endpoint}", request_body(engines.model, endpoint, stream))
    assert reply.status == 200, f"{endpoint} stream={stream}: {reply.status} {reply.body[:600]!r}"
    if stream:
        assert reply.headers.get("content-type", "").startswith("text/event-stream"), reply.headers
        chunks, done = sse_objects(reply.body)
        shapes.stream_chunks(chunks, done, chat=chat, model=engines.model,
                             max_tokens=MAX_TOKENS, usage_chunk=True)
        prompt_tokens = next(c["usage"]["prompt_tokens"] for c in chunks if not c["choices"])
    else:
        assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
        body = reply.json()
        shapes.completion_body(body, chat=chat, model=engines.model, max_tokens=MAX_TOKENS)
        prompt_tokens = body["usage"]["prompt_tokens"]
    legs = [now - then for now, then in zip(_legs(engines), before, strict=True)]
    # (prefill requests, of which max_tokens=1, decode requests, of which max_tokens=1)
    assert legs == [1, 1, 1, 0], f"legs seen (P all, P one-token, D all, D one-token): {legs}"
    external = engines.decode.external_kv_tokens() - external_before
    assert external > 0, "decode engine loaded no prompt tokens over NIXL (external_kv_transfer)"
    assert external <= prompt_tokens, f"{external} external KV tokens for a {prompt_tokens}-token prompt"


def assert_failed_handoff_is_an_error(router: str, engines: EnginePair) -> dict[str, Any]:
    """With the producer dropping its KV lease at once, the decode pull fails; the client must
    get a 5xx, never a 200 whose prompt was quietly recomputed on the decode engine."""
    fault = f"{engines.prefill.url}/emu/fault"
    assert post_json(fault, {"fault": "drop_lease_early"}).status == 200
    try:
        external_before = engines.decode.external_kv_tokens()
        reply = post_json(f"{router}/v1/completions",
                          request_body(engines.model, "/v1/completions", False))
    finally:
        assert post_json(fault, {"fault": "clear"}).status == 200
    assert 500 <= reply.status < 600, f"failed handoff answered {reply.status}: {reply.body[:400]!r}"
    assert engines.decode.external_kv_tokens() == external_before
    body = reply.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    return body
