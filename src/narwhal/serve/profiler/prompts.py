"""Fresh prompts of a chosen token length, so prefix caching never shortens a measured prefill
(narwhal-profile's sweeps and narwhal-check's probes alike).

Every prompt starts with a nonce never sent before: prefix caches hash whole blocks chained from
the first, so a unique first block makes every block of the prompt a miss. (A probe that hit
a cache would time a lookup, not a prefill, and a handoff whose consumer already held the
prompt would move no KV: both would pass for the wrong reason.) The body is a filler
word repeated; the engine's own tokenizer (`POST /tokenize`) says how many tokens that makes,
and the word count is corrected until the prompt has the wanted length (or within a token or
two of it, for tokenizers that merge the nonce with its neighbour). What the fit uses in the end
is the engine's own `usage.prompt_tokens`, not this estimate.
"""

from __future__ import annotations

import secrets
import string

from narwhal.serve.engine_client import EngineCallFailed, EngineClient

FILLER = " the"
_TRIES = 4
_ALPHABET = string.ascii_lowercase + string.digits
_NONCE_CHARS = 8  # 36^8 ~ 2.8e12 values; few tokens even where the tokenizer is per-character


def nonce() -> str:
    """A prefix no earlier prompt had (with overwhelming probability), short in tokens."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(_NONCE_CHARS)) + ":"


class PromptMaker:
    """Builds prompts of `n` tokens for one engine and model."""

    def __init__(self, client: EngineClient, model: str) -> None:
        self.client = client
        self.model = model
        self._per_word = 1.0

    async def calibrate(self) -> None:
        """Tokens per filler word on this engine's tokenizer (1 on most)."""
        base = len(await self.client.tokenize(self.model, nonce()))
        more = len(await self.client.tokenize(self.model, nonce() + FILLER * 64))
        self._per_word = max((more - base) / 64, 0.25)

    async def make(self, tokens: int) -> str:
        """A fresh prompt of about `tokens` tokens, never longer (the engine's limit holds)."""
        return (await self.make_counted(tokens))[0]

    async def make_counted(self, tokens: int) -> tuple[str, int]:
        """`make`, with the prompt's token count on this engine."""
        head = nonce()
        words = max(int(tokens / self._per_word) - 8, 0)
        count = 0
        for _ in range(_TRIES):
            count = len(await self.client.tokenize(self.model, head + FILLER * words))
            if count == tokens or (count < tokens and tokens - count <= 1):
                break
            words = max(words + int((tokens - count) / self._per_word), 0)
        while count > tokens and words > 0:  # the cap is a hard limit: trim to it
            words = max(words - max(int((count - tokens) / self._per_word), 1), 0)
            count = len(await self.client.tokenize(self.model, head + FILLER * words))
        if count > tokens:
            raise EngineCallFailed(self.client.id, "POST /tokenize",
                                   f"cannot make a fresh prompt of {tokens} tokens (the unique "
                                   f"prefix alone is {count}); raise the shortest of "
                                   "--prefill-lengths / --decode-contexts")
        return head + FILLER * words, count


def renewed(prompt: str) -> str:
    """The same prompt under a new nonce: as fresh to a prefix cache, no tokenize call again
    (nonces are all of one length and alphabet, so the count stays within a token)."""
    return nonce() + prompt[_NONCE_CHARS + 1:]


async def sized_prompt(client: EngineClient, model: str, tokens: int) -> tuple[str, int]:
    """A fresh prompt of about `tokens` tokens on `client`'s tokenizer, and its exact count."""
    maker = PromptMaker(client, model)
    await maker.calibrate()
    return await maker.make_counted(tokens)
