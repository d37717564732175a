"""One timed decode stream that knows how many tokens each chunk carried.

A server that falls behind its client coalesces several tokens into one SSE chunk (vLLM does
on a busy CPU engine), so "one chunk = one step" undercounts steps and overstates step time.
With `continuous_usage_stats` every chunk carries the running `completion_tokens`, which says
how many steps each gap between chunks spans. A server without it is taken at one token per
chunk. Times are `time.perf_counter()` values, so streams started together share one clock.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import aiohttp

from narwhal.serve.engine_client import EngineCallFailed, EngineClient


@dataclass(frozen=True)
class TimedStream:
    """Arrival time and cumulative completion tokens of every chunk that brought new tokens.

    Text is not the test: a random-weight model can emit byte tokens that are not yet whole
    UTF-8 characters, and their chunks carry empty text."""

    times: tuple[float, ...]
    tokens: tuple[int, ...]
    prompt_tokens: int

    def tokens_by(self, moment: float) -> int:
        """Completion tokens received at or before `moment` (0 before the first chunk)."""
        got = 0
        for t, n in zip(self.times, self.tokens, strict=True):
            if t > moment:
                break
            got = n
        return got


async def timed_stream(client: EngineClient, model: str, prompt: str, max_tokens: int,
                       where: str) -> TimedStream:
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
               "stream": True, "ignore_eos": True,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    times: list[float] = []
    tokens: list[int] = []
    prompt_tokens = 0
    what = f"POST /v1/completions ({where})"
    try:
        async with client.session.post(client.base_url + "/v1/completions", json=payload,
                                       timeout=client.timeout, headers=client.headers) as resp:
            if resp.status != 200:
                body = (await resp.read()).decode("utf-8", "replace")[:200]
                raise EngineCallFailed(client.id, what, f"answered {resp.status}: {body}")
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or {}
                prompt_tokens = int(usage.get("prompt_tokens", prompt_tokens))
                last = tokens[-1] if tokens else 0
                count = usage.get("completion_tokens")
                if count is None and chunk.get("choices"):
                    count = last + 1  # a server without continuous usage: one token per chunk
                if count is not None and int(count) > last:
                    tokens.append(int(count))
                    times.append(now)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError, TypeError, AttributeError) as exc:
        raise EngineCallFailed(client.id, what, f"{type(exc).__name__}: {exc}") from None
    if prompt_tokens <= 0:
        raise EngineCallFailed(client.id, what, "no usage.prompt_tokens in the stream")
    return TimedStream(tuple(times), tuple(tokens), prompt_tokens)
