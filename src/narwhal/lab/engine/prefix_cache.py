"""Automatic prefix caching, as far as a client can see it: repeated prefixes prefill faster.

Full blocks of prompt tokens are identified by a hash chained over the previous block, like
vLLM's block hashes, and kept in an LRU bounded by the engine's block count. A hit skips the
prefill of those tokens and is counted as `local_cache_hit`; like vLLM, at least the last
prompt token is always computed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """LRU of chained block hashes; `lookup_and_insert` is called once per admitted prompt."""

    def __init__(self, block_size: int, capacity_blocks: int, enabled: bool) -> None:
        self.block_size = block_size
        self.capacity = max(capacity_blocks, 0)
        self.enabled = enabled and self.capacity > 0
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def lookup_and_insert(self, prompt_ids: Sequence[int]) -> int:
        """Prompt tokens already cached (whole blocks within the first len-1); then cache this prompt."""
        if not self.enabled:
            return 0
        bs = self.block_size
        blocks = self._blocks
        parent = 0
        hit_blocks = 0
        matching = True
        for start in range(0, len(prompt_ids) - bs + 1, bs):
            key = hash((parent, tuple(prompt_ids[start:start + bs])))
            if matching and key in blocks:
                hit_blocks += 1
                blocks.move_to_end(key)
            else:
                matching = False
                blocks[key] = None
            parent = key
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)
        # vLLM looks for hits within the first len-1 tokens, in whole blocks
        return min(hit_blocks * bs, max(len(prompt_ids) - 1, 0) // bs * bs)

    def reset(self) -> None:
        self._blocks.clear()
