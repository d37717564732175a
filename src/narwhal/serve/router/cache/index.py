"""What one engine's prefix cache holds, as the router knows it.

Two ways of knowing, stated per engine and never mixed:
- `events`: the engine publishes vLLM's KV cache events; stored blocks are keyed by the
  router's chain over their token ids (blocks.py) and removed by the engine's own hashes. A
  batch the router missed (a gap in sequence numbers, a publisher that restarted, a frame it
  refused) leaves it unsure what was evicted, so the engine's blocks are forgotten and learned
  again: predictions err low (an unpriced hit) rather than high (a hit that is not there).
- `approximate`: the engine publishes nothing; the router records the prompts it sent there in
  an LRU sized from the engine's block count. It cannot see evictions caused by traffic that
  bypassed it, which is why it is stated in state and metrics.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal

from narwhal.core.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    EventBatch,
)
from narwhal.serve.router.cache.blocks import ROOT, chain

Mode = Literal["events", "approximate"]


class EngineCache:
    """The blocks one engine holds, under the router's keys."""

    def __init__(self, mode: Mode, capacity_blocks: int, block_size: int | None = None) -> None:
        self.mode: Mode = mode
        self.capacity = max(capacity_blocks, 0)
        self.block_size = block_size
        self._keys: OrderedDict[int, int] = OrderedDict()  # router key -> engine copies
        self._by_engine: dict[EngineHash, int] = {}
        self.next_seq: int | None = None
        self.counts = {"batches": 0, "stored": 0, "removed": 0, "cleared": 0, "gaps": 0,
                       "refused": 0, "orphans": 0}

    @property
    def blocks(self) -> int:
        return len(self._keys)

    def matched_blocks(self, keys: Sequence[int]) -> int:
        """How many leading keys of a prompt this engine holds."""
        held = self._keys
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    # --- events ------------------------------------------------------------------------

    def apply(self, batch: EventBatch) -> None:
        """One batch, in order; a gap or a restarted publisher forgets what was known first."""
        if self.next_seq is not None and batch.seq != self.next_seq:
            self.counts["gaps"] += 1
            self.forget()
        self.next_seq = batch.seq + 1
        self.counts["batches"] += 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                self._removed(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.counts["cleared"] += 1
                self.forget()

    def refused(self) -> None:
        """A frame the router could not read: it may have described any block."""
        self.counts["refused"] += 1
        self.forget()

    def forget(self) -> None:
        self._keys.clear()
        self._by_engine.clear()

    def _stored(self, event: BlockStored) -> None:
        if event.group_idx not in (None, 0):
            return  # another KV cache group (hybrid models) repeats group 0's prefix
        if event.parent_block_hash is None:
            parent = ROOT
        else:
            known = self._by_engine.get(event.parent_block_hash)
            if known is None:
                self.counts["orphans"] += 1  # its prefix is unknown: it cannot be keyed
                return
            parent = known
        self.block_size = event.block_size
        keys = chain(event.token_ids, event.block_size, parent)
        for engine_hash, key in zip(event.block_hashes, keys, strict=True):
            if engine_hash in self._by_engine:
                continue
            self._by_engine[engine_hash] = key
            self._keys[key] = self._keys.get(key, 0) + 1
        self.counts["stored"] += len(keys)

    def _removed(self, hashes: Sequence[EngineHash]) -> None:
        for engine_hash in hashes:
            key = self._by_engine.pop(engine_hash, None)
            if key is None:
                continue
            left = self._keys[key] - 1
            if left:
                self._keys[key] = left
            else:
                del self._keys[key]
            self.counts["removed"] += 1

    # --- routing history ---------------------------------------------------------------

    def routed(self, keys: Sequence[int]) -> None:
        """A prompt with these block keys was sent here (approximate mode only)."""
        if self.mode != "approximate" or not self.capacity:
            return
        held = self._keys
        for key in keys:
            held[key] = 1
            held.move_to_end(key)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def state(self) -> dict[str, object]:
        return {"mode": self.mode, "block_size": self.block_size, "blocks": self.blocks,
                **({"capacity_blocks": self.capacity} if self.mode == "approximate" else {}),
                **({} if self.mode == "approximate" else {"events": dict(self.counts)})}
