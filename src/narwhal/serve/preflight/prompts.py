"""Fresh probe prompts: a unique nonce first, so no engine can answer from its prefix cache.

A probe that hit a prefix cache would measure a cache lookup, not a prefill, and a handoff
whose consumer already held the prompt would move no KV; both would pass for the wrong reason.
The nonce leads the prompt because prefix caches match from the first token.
"""

from __future__ import annotations

import secrets

from narwhal.serve.engine_client import EngineClient

_FILLER = ("the", "tide", "turns", "over", "the", "harbour", "wall", "while", "ships", "wait",
           "for", "the", "light", "and", "keepers", "count", "hours", "until", "fleet", "comes",
           "home", "across", "grey", "water")
_MAX_ROUNDS = 4  # tokenize-and-adjust rounds; the ratio converges in one or two


def nonce() -> str:
    return secrets.token_hex(6)


def words(count: int, tag: str) -> str:
    """`count` filler words after the nonce `tag`."""
    body = [_FILLER[i % len(_FILLER)] for i in range(max(count, 1))]
    return f"probe {tag}: " + " ".join(body)


async def sized_prompt(client: EngineClient, model: str, tokens: int, tag: str) -> tuple[str, int]:
    """A prompt led by `tag` of about `tokens` tokens on `client`'s tokenizer, and its exact count.

    Tokenizers differ (the emulator's, a real BPE), so the word count is adjusted by the
    measured tokens-per-word ratio until it is within 5% (at most a few tokenize calls).
    """
    count = max(tokens // 2, 1)
    text = words(count, tag)
    got = len(await client.tokenize(model, text))
    for _ in range(_MAX_ROUNDS):
        if abs(got - tokens) <= max(1, tokens // 20):
            break
        count = max(1, round(count * tokens / max(got, 1)))
        text = words(count, tag)
        got = len(await client.tokenize(model, text))
    return text, got
