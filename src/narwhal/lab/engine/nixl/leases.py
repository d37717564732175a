"""Producer-side KV leases: blocks held for a remote reader, freed on its notification or expiry.

Like vLLM's `_reqs_to_send`, leases live in an insertion-ordered dict; every lease has the same
duration, so insertion order is expiry order and a sweep stops at the first live lease. Recently
expired ids are remembered in a bounded map so a late reader can be told "expired" rather than
"unknown", and a late notification is counted (vllm:nixl_num_notifications_after_expiry).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from narwhal.lab.engine.nixl.api import KvMetrics

EXPIRED_MEMORY = 4096  # expired request ids remembered for diagnosis; older ones are "unknown"


@dataclass
class Lease:
    """One request's blocks held for remote reading."""

    request_id: str
    block_ids: list[list[int]]
    tokens: int
    expires_at: float
    notified: int = 0

    @property
    def num_blocks(self) -> int:
        return sum(len(group) for group in self.block_ids)


class BlockPool:
    """Logical block ids of the emulated KV cache; id 0 is vLLM's reserved null block.

    An emulated 80 GiB GPU holds millions of small-model blocks, so ids are handed out lazily:
    a counter for never-used ids plus the ids given back, never a list of every block.
    """

    def __init__(self, num_blocks: int) -> None:
        self.capacity = max(0, num_blocks - 1)
        self._next_unused = 1
        self._returned: deque[int] = deque()

    @property
    def free(self) -> int:
        return self.capacity - (self._next_unused - 1) + len(self._returned)

    def take(self, count: int) -> list[int]:
        free = self.free
        if count > free:
            raise RuntimeError(f"KV cache full: {count} blocks needed, {free} of "
                               f"{self.capacity} free (the rest are held under leases)")
        reused = [self._returned.popleft() for _ in range(min(count, len(self._returned)))]
        fresh = count - len(reused)
        start = self._next_unused
        self._next_unused += fresh
        return reused + list(range(start, start + fresh))

    def give(self, ids: list[int]) -> None:
        self._returned.extend(ids)


class LeaseTable:
    """All leases of one producer engine."""

    def __init__(self, lease_seconds: float, pool: BlockPool, metrics: KvMetrics,
                 log: logging.Logger, clock: Callable[[], float] = time.perf_counter) -> None:
        self.lease_seconds = lease_seconds
        self.pool = pool
        self._metrics = metrics
        self._log = log
        self._clock = clock
        self._held: dict[str, Lease] = {}
        self._expired: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, request_id: str, blocks_per_group: list[int], tokens: int) -> Lease:
        """Allocate the request's blocks and start its lease (a reused id replaces the old one)."""
        self.sweep()
        old = self._held.pop(request_id, None)
        if old is not None:
            self._free(old)
        ids = self.pool.take(sum(blocks_per_group))
        groups, start = [], 0
        for n in blocks_per_group:
            groups.append(ids[start:start + n])
            start += n
        lease = Lease(request_id=request_id, block_ids=groups, tokens=tokens,
                      expires_at=self._clock() + self.lease_seconds)
        self._held[request_id] = lease
        self._expired.pop(request_id, None)
        self._report()
        return lease

    def state(self, request_id: str) -> Literal["held", "expired", "unknown"]:
        """Whether a reader arriving now finds the request's blocks."""
        self.sweep()
        if request_id in self._held:
            return "held"
        return "expired" if request_id in self._expired else "unknown"

    def get(self, request_id: str) -> Lease | None:
        return self._held.get(request_id) if self.state(request_id) == "held" else None

    def notified(self, request_id: str) -> bool:
        """The reader's notification: free the blocks; False when they were no longer held."""
        lease = self._held.pop(request_id, None)
        if lease is None:
            self._metrics.notification_after_expiry()
            self._log.error("Potentially invalid KV blocks for unrecognized request %s were "
                            "retrieved by a decode worker. They may have expired.", request_id)
            return False
        lease.notified += 1
        self._free(lease)
        return True

    def expire(self, request_id: str) -> None:
        """Release a lease now, exactly as if it had run out (fault drop_lease_early)."""
        lease = self._held.pop(request_id, None)
        if lease is not None:
            self._expire(lease)
            self._metrics.lease_expired(1)

    def sweep(self) -> int:
        """Release every lease past its expiry; returns how many."""
        now = self._clock()
        count = 0
        while self._held:
            lease = next(iter(self._held.values()))
            if now < lease.expires_at:
                break
            del self._held[lease.request_id]
            self._expire(lease)
            count += 1
        if count:
            self._metrics.lease_expired(count)
        return count

    def clear(self) -> None:
        for lease in self._held.values():
            self.pool.give([b for group in lease.block_ids for b in group])
        self._held.clear()
        self._report()

    def _expire(self, lease: Lease) -> None:
        self._log.warning("Releasing expired KV blocks for request %s which were retrieved by "
                          "%d remote worker(s) before lease expired.", lease.request_id,
                          lease.notified)
        self._free(lease)
        self._expired[lease.request_id] = None
        while len(self._expired) > EXPIRED_MEMORY:
            self._expired.popitem(last=False)

    def _free(self, lease: Lease) -> None:
        self.pool.give([b for group in lease.block_ids for b in group])
        self._report()

    def _report(self) -> None:
        """Blocks held for remote readers stay allocated in vLLM's one KV cache, so they count
        in the engine's `vllm:kv_cache_usage_perc` until read or expired."""
        pool = self.pool
        self._metrics.kv_held(pool.capacity - pool.free, pool.capacity)
