"""The request bodies the captures were taken with, shared by the capture and the checks.

A shape comparison is only fair when both engines were asked the same thing, so the capture
script and every check build their bodies here.
"""

from __future__ import annotations

from typing import Any

SERVED_NAME = "tiny-llama"
PROMPT = "The decode side pulls those blocks over the fabric and checks the layout."
HANDOFF_PROMPT = ("The prefill side computes the prompt once, keeps its blocks under a short "
                  "lease, and tells the router where they live.")
CHAT = [{"role": "user", "content": "Where do the blocks live?"}]
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
MAX_TOKENS = 5


def completion(prompt: str = PROMPT, model: str = SERVED_NAME, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            **extra}


def chat(model: str = SERVED_NAME, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0,
            **extra}


def prefill(prompt: str = HANDOFF_PROMPT, model: str = SERVED_NAME) -> dict[str, Any]:
    """The producer leg: one token, and ask the engine to keep the KV for a remote decode."""
    return completion(prompt, model, max_tokens=1, kv_transfer_params=PREFILL_PARAMS)
