"""Automatic prefix caching, as far as a client can see it: repeated prefixes prefill faster.

Full blocks of prompt tokens are identified by a hash chained over the previous block, like
vLLM's block hashes, and kept in an LRU bounded by the engine's block count. A hit skips the
prefill of those tokens and is counted as `local_cache_hit`; like vLLM, at least the last
prompt token is always computed. Every change is told to `sink` as vLLM's KV cache events
(stored blocks with their token ids, evicted blocks, a full reset), so an engine started with
`--kv-events-config` publishes what a real one would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from narwhal.core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, Event

EventSink = Callable[[list[Event]], None]
MEDIUM = "GPU"  # what vLLM names the device tier, on its CPU platform too
FULL_ATTENTION = "full_attention"  # the emulated models' one KV cache group
UNSIGNED_64 = (1 << 64) - 1  # vLLM publishes block hashes as unsigned 64-bit integers


def block_key(parent: int, tokens: Sequence[int]) -> int:
    """A block's hash chained over its parent's, unsigned as vLLM's published hashes are."""
    return hash((parent, tuple(tokens))) & UNSIGNED_64


class PrefixCache:
    """LRU of chained block hashes; `lookup_and_insert` is called once per admitted prompt."""

    def __init__(self, block_size: int, capacity_blocks: int, enabled: bool,
                 sink: EventSink | None = None) -> None:
        self.block_size = block_size
        self.capacity = max(capacity_blocks, 0)
        self.enabled = enabled and self.capacity > 0
        self.sink = sink
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def lookup_and_insert(self, prompt_ids: Sequence[int]) -> int:
        """Prompt tokens already cached (whole blocks within the first len-1); then cache this prompt."""
        if not self.enabled:
            return 0
        bs = self.block_size
        blocks = self._blocks
        parent = 0
        hit_blocks = 0
        stored: list[int] = []
        first_new = 0
        for start in range(0, len(prompt_ids) - bs + 1, bs):
            key = block_key(parent, prompt_ids[start:start + bs])
            if not stored and key in blocks:
                hit_blocks += 1
                blocks.move_to_end(key)
            else:
                if not stored:
                    first_new = start
                stored.append(key)
                blocks[key] = None
                blocks.move_to_end(key)
            parent = key
        evicted = [blocks.popitem(last=False)[0] for _ in range(len(blocks) - self.capacity)]
        if self.sink is not None and (stored or evicted):
            self.sink(self._events(prompt_ids, stored, first_new, evicted))
        # vLLM looks for hits within the first len-1 tokens, in whole blocks
        return min(hit_blocks * bs, max(len(prompt_ids) - 1, 0) // bs * bs)

    def _events(self, prompt_ids: Sequence[int], stored: list[int], first_new: int,
                evicted: list[int]) -> list[Event]:
        events: list[Event] = []
        if stored:
            end = first_new + len(stored) * self.block_size
            parent = None if first_new == 0 else self._parent_of(prompt_ids, first_new)
            events.append(BlockStored(tuple(stored), parent, tuple(prompt_ids[first_new:end]),
                                      self.block_size, MEDIUM, group_idx=0,
                                      kv_cache_spec_kind=FULL_ATTENTION))
        if evicted:
            events.append(BlockRemoved(tuple(evicted), MEDIUM))
        return events

    def keep_output(self, token_ids: Sequence[int]) -> None:
        """A finished request's prompt and generated tokens: the full blocks whose KV was
        computed (all but the last token) stay cached, as vLLM caches blocks filled while
        decoding, so the next turn of a conversation finds the reply too."""
        if not self.enabled:
            return
        bs = self.block_size
        blocks = self._blocks
        parent = 0
        stored: list[int] = []
        first_new = 0
        computed = len(token_ids) - 1
        for start in range(0, computed - bs + 1, bs):
            key = block_key(parent, token_ids[start:start + bs])
            if key in blocks:
                blocks.move_to_end(key)
            elif not stored or start == first_new + len(stored) * bs:
                if not stored:
                    first_new = start
                stored.append(key)
                blocks[key] = None
            parent = key
        evicted = [blocks.popitem(last=False)[0] for _ in range(len(blocks) - self.capacity)]
        if self.sink is not None and (stored or evicted):
            self.sink(self._events(token_ids, stored, first_new, evicted))

    def _parent_of(self, prompt_ids: Sequence[int], start: int) -> int:
        bs = self.block_size
        parent = 0
        for s in range(0, start, bs):
            parent = block_key(parent, prompt_ids[s:s + bs])
        return parent

    def reset(self) -> None:
        self._blocks.clear()
        if self.sink is not None and self.enabled:
            self.sink([AllBlocksCleared()])
