"""Matched prefix tokens per engine for one prompt: the question placement asks.

A prompt's block keys are computed once per block size in use (engines of one fleet share
one in practice) and every engine's cache is asked how many leading keys it holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from narwhal.serve.router.cache.blocks import cacheable_tokens, chain
from narwhal.serve.router.cache.index import EngineCache


class PromptKeys:
    """One prompt's block keys, computed on first use for each block size."""

    __slots__ = ("_by_size", "token_ids")

    def __init__(self, token_ids: Sequence[int]) -> None:
        self.token_ids = token_ids
        self._by_size: dict[int, list[int]] = {}

    def keys(self, block_size: int) -> list[int]:
        keys = self._by_size.get(block_size)
        if keys is None:
            keys = self._by_size[block_size] = chain(self.token_ids, block_size)
        return keys


class FleetCache:
    """Every engine's EngineCache, by engine name."""

    def __init__(self, engines: Mapping[str, EngineCache]) -> None:
        self.engines = dict(engines)

    def matched_tokens(self, prompt: PromptKeys) -> dict[str, int]:
        """Prompt tokens each engine would serve from its cache (0 where unknown)."""
        out: dict[str, int] = {}
        total = len(prompt.token_ids)
        for name, cache in self.engines.items():
            bs = cache.block_size
            if not bs or not cache.blocks:
                out[name] = 0
                continue
            blocks = cache.matched_blocks(prompt.keys(bs))
            out[name] = min(blocks * bs, cacheable_tokens(total, bs))
        return out

    def routed(self, name: str, prompt: PromptKeys) -> None:
        """The prompt was placed on `name` (the approximate mode learns from it)."""
        cache = self.engines.get(name)
        if cache is not None and cache.mode == "approximate" and cache.block_size:
            cache.routed(prompt.keys(cache.block_size))

    def state(self) -> dict[str, object]:
        return {name: cache.state() for name, cache in sorted(self.engines.items())}
