"""Producer leases free blocks on the reader's notification or on expiry, never keep them."""

from __future__ import annotations

import pytest

from narwhal.lab.engine.nixl.leases import EXPIRED_MEMORY, BlockPool, LeaseTable
from tests.unit.engine_nixl.helpers import Metrics, recorded_logger


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def table(lease: float = 30.0, blocks: int = 64) -> tuple[LeaseTable, Clock, Metrics, list[str]]:
    clock, metrics = Clock(), Metrics()
    log, lines = recorded_logger("leases")
    return LeaseTable(lease, BlockPool(blocks), metrics, log, clock=clock), clock, metrics, \
        lines.lines


def test_held_blocks_are_freed_by_the_readers_notification() -> None:
    leases, _, metrics, _ = table()
    lease = leases.hold("req-1", [3], 306)
    assert lease.block_ids == [[1, 2, 3]]  # block 0 is vLLM's null block
    assert leases.pool.free == 60
    assert leases.notified("req-1") is True
    assert leases.pool.free == 63 and len(leases) == 0
    assert metrics.after_expiry == 0


def test_held_blocks_are_reported_as_used_until_read_or_expired() -> None:
    leases, clock, metrics, _ = table(lease=1.0)
    leases.hold("req-1", [3], 306)
    leases.hold("req-2", [2], 200)
    assert metrics.held_blocks == 5  # counted in the engine's vllm:kv_cache_usage_perc
    leases.notified("req-1")
    assert metrics.held_blocks == 2
    clock.now += 2
    leases.sweep()
    assert metrics.held_blocks == 0


def test_an_unread_lease_expires_with_vllms_line_and_counts() -> None:
    leases, clock, metrics, lines = table(lease=30.0)
    leases.hold("req-1", [3], 306)
    clock.now += 29.9
    assert leases.sweep() == 0 and leases.state("req-1") == "held"
    clock.now += 0.2
    assert leases.sweep() == 1
    assert lines == ["WARNING Releasing expired KV blocks for request req-1 which were retrieved "
                     "by 0 remote worker(s) before lease expired."]
    assert metrics.expired == 1
    assert leases.pool.free == 63
    assert leases.state("req-1") == "expired" and leases.get("req-1") is None


def test_a_notification_after_expiry_is_counted_and_logged_like_vllm() -> None:
    leases, clock, metrics, lines = table(lease=1.0)
    leases.hold("req-1", [2], 200)
    clock.now += 2
    leases.sweep()  # vLLM reads notifications before its sweep; once swept, they are late
    assert leases.notified("req-1") is False
    assert metrics.after_expiry == 1
    assert lines[-1] == ("ERROR Potentially invalid KV blocks for unrecognized request req-1 "
                         "were retrieved by a decode worker. They may have expired.")


def test_drop_early_releases_at_once_as_an_expiry() -> None:
    leases, _, metrics, lines = table()
    leases.hold("req-1", [3], 306)
    leases.expire("req-1")
    assert leases.state("req-1") == "expired" and metrics.expired == 1
    assert "Releasing expired KV blocks for request req-1" in lines[-1]
    leases.expire("req-1")  # a second drop of the same request changes nothing
    assert metrics.expired == 1


def test_a_sweep_stops_at_the_first_live_lease_and_keeps_later_ones() -> None:
    leases, clock, _, _ = table(lease=10.0)
    leases.hold("a", [1], 1)
    clock.now += 5
    leases.hold("b", [1], 1)
    clock.now += 6
    assert leases.sweep() == 1
    assert leases.state("a") == "expired" and leases.state("b") == "held"


def test_expired_ids_are_remembered_only_up_to_a_bound() -> None:
    leases, clock, _, _ = table(lease=1.0, blocks=4)
    for i in range(EXPIRED_MEMORY + 5):
        leases.hold(f"r{i}", [1], 1)
        clock.now += 2
        leases.sweep()
    assert leases.state("r0") == "unknown"  # forgotten: memory stays bounded
    assert leases.state(f"r{EXPIRED_MEMORY + 4}") == "expired"


def test_a_full_cache_says_how_many_blocks_are_held() -> None:
    leases, _, _, _ = table(blocks=4)
    leases.hold("a", [3], 300)
    with pytest.raises(RuntimeError, match="KV cache full: 2 blocks needed, 0 of 3 free"):
        leases.hold("b", [2], 200)


def test_holding_a_request_id_again_replaces_its_lease_without_leaking_blocks() -> None:
    leases, _, _, _ = table()
    leases.hold("a", [3], 300)
    leases.hold("a", [2], 200)
    assert leases.pool.free == 61 and len(leases) == 1


def test_transfer_groups_get_their_own_block_lists() -> None:
    leases, _, _, _ = table()
    assert leases.hold("a", [2, 1], 300).block_ids == [[1, 2], [3]]
