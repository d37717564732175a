"""A consumer pulls the producer's KV over real sockets, and each failure reads like vLLM's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from narwhal.core.kv.transfer import request_transfer
from narwhal.lab.engine.nixl import failures
from narwhal.lab.engine.nixl.api import KvLoadFailed
from narwhal.lab.engine.nixl.wire import AgentBlob
from narwhal.node.nixl_probe import probe
from tests.component.engine_nixl.harness import PROMPT, engine, run, started, target
from tests.unit.engine_nixl.helpers import tiny

pytestmark = pytest.mark.timeout(60)


def test_a_pull_moves_exactly_the_predicted_bytes_and_frees_the_producers_blocks() -> None:
    p, d = engine("p"), engine("d")

    async def scenario() -> None:
        async with started(p, d):
            params = p.connector.hold("req-1", PROMPT)
            assert len(p.connector.leases) == 1
            outcome = await d.connector.pull(params, PROMPT)
            want = request_transfer(d.geometry, len(PROMPT))
            assert outcome.bytes_moved == want.total_bytes == 393216  # 3 blocks of 128 KiB
            assert outcome.tokens == 306 and outcome.descriptors == 6
            assert outcome.handshake_seconds > 0 and outcome.seconds > 0
            assert len(p.connector.leases) == 0  # the notification freed them
            assert d.metrics.done == [outcome] and d.metrics.failed == 0
            assert d.lines.having(
                f"NIXL compatibility check passed (hash: {p.geometry.compatibility_hash})")
            again = await d.connector.pull(p.connector.hold("req-2", PROMPT), PROMPT)
            assert again.handshake_seconds == 0.0  # cached per remote engine id
            assert len(d.lines.having("NIXL compatibility check passed")) == 1
    run(scenario)


def test_the_kv_scale_shrinks_the_bytes_moved() -> None:
    p, d = engine("p"), engine("d", kv_scale=0.25)

    async def scenario() -> None:
        async with started(p, d):
            outcome = await d.connector.pull(p.connector.hold("r", PROMPT), PROMPT)
            assert outcome.bytes_moved == 393216 // 4
    run(scenario)


def test_concurrent_first_pulls_share_one_handshake() -> None:
    p, d = engine("p"), engine("d")

    async def scenario() -> None:
        async with started(p, d):
            params = [p.connector.hold(f"req-{i}", PROMPT) for i in range(8)]
            outcomes = await asyncio.gather(*(d.connector.pull(x, PROMPT) for x in params))
            assert all(o.bytes_moved == 393216 for o in outcomes)
            assert len(d.lines.having("NIXL compatibility check passed")) == 1
            assert len(p.connector.leases) == 0
    run(scenario)


@pytest.mark.parametrize(("producer", "consumer"), [
    ({"tensor_parallel_size": 1}, {"tensor_parallel_size": 2}),
    ({"tensor_parallel_size": 2}, {"tensor_parallel_size": 1}),
])
def test_heterogeneous_tp_hand_shakes_the_right_ranks_and_moves_the_consumers_bytes(
        producer: dict[str, Any], consumer: dict[str, Any]) -> None:
    p = engine("p", tiny(block_size=16, **producer))
    d = engine("d", tiny(block_size=16, **consumer))

    async def scenario() -> None:
        async with started(p, d):
            outcome = await d.connector.pull(p.connector.hold("r", PROMPT), PROMPT)
            assert outcome.bytes_moved == request_transfer(d.geometry, 306).total_bytes
            ranks = p.geometry.tp if p.geometry.tp > d.geometry.tp else 1
            assert len(d.lines.having("NIXL compatibility check passed")) == ranks
    run(scenario)


@pytest.mark.parametrize("consumer_plan", [
    {"dtype": "bfloat16"},
    {"model": "/other/mount/tiny-llama"},
    {"kv_cache_dtype": "fp8"},
])
def test_a_hash_mismatch_fails_the_pull_with_vllms_message_naming_both_hashes(
        consumer_plan: dict[str, Any]) -> None:
    p, d = engine("p"), engine("d", tiny(**consumer_plan))

    async def scenario() -> None:
        async with started(p, d):
            params = p.connector.hold("req-1", PROMPT)
            local, remote = d.geometry.compatibility_hash, p.geometry.compatibility_hash
            assert local != remote
            with pytest.raises(KvLoadFailed) as err:
                await d.connector.pull(params, PROMPT)
            assert err.value.log_line == failures.hash_mismatch(local, remote)
            assert d.lines.having(f"Local: {local}, Remote: {remote}")
            assert d.metrics.failed == 1 and d.metrics.done == []
            assert len(p.connector.leases) == 1  # nothing was read
    run(scenario)


def test_requests_sharing_one_failed_handshake_count_one_failure_and_each_log_theirs() -> None:
    """vLLM counts a failed handshake once, however many requests waited on it; each request
    still logs its own handshake_failed line (with its own id and block counts)."""
    p, d = engine("p"), engine("d", tiny(dtype="bfloat16"))

    async def scenario() -> None:
        async with started(p, d):
            params = [p.connector.hold(f"req-{i}", PROMPT) for i in range(4)]
            results = await asyncio.gather(
                *(d.connector.pull(x, PROMPT, f"cmpl-d{i}-0-ab") for i, x in enumerate(params)),
                return_exceptions=True)
            assert all(isinstance(r, KvLoadFailed) for r in results)
            assert d.metrics.failed == 1
            assert len(d.lines.having("handshake_setup_failed")) == 1
            lines = d.lines.having("NIXL transfer failure: handshake_failed")
            assert len(lines) == 4
            assert all("'num_local_blocks': 3" in line for line in lines)
            for i in range(4):
                assert sum(f"'request_id': 'cmpl-d{i}-0-ab'" in line for line in lines) == 1
    run(scenario)


def test_the_release_after_a_failure_frees_the_producers_blocks_once_reachable() -> None:
    """The clean-up vLLM sends for a failed remote prefill: once the handshake works again,
    the producer is told and frees the request's blocks before their lease runs out."""
    p, d = engine("p"), engine("d", handshake_timeout_s=0.3)

    async def scenario() -> None:
        async with started(p, d):
            params = p.connector.hold("req-1", PROMPT)
            p.faults.refuse_handshakes = True
            with pytest.raises(KvLoadFailed):
                await d.connector.pull(params, PROMPT, "cmpl-x-0-ab")
            p.faults.refuse_handshakes = False
            await d.connector.release(params, "x")
            assert len(p.connector.leases) == 0
            assert d.metrics.failed == 1  # the release's handshake worked
    run(scenario)


def test_a_block_size_the_consumer_cannot_nest_fails_the_runtime_check() -> None:
    p, d = engine("p", tiny(block_size=32)), engine("d", tiny(block_size=16))

    async def scenario() -> None:
        async with started(p, d):
            assert p.geometry.compatibility_hash == d.geometry.compatibility_hash
            with pytest.raises(KvLoadFailed,
                               match="Local block size 16 is not divisible by remote block "
                                     "size 32"):
                await d.connector.pull(p.connector.hold("r", PROMPT), PROMPT)
            assert d.lines.having("NIXL compatibility check passed")  # the hash did pass
    run(scenario)


def test_without_enforcement_a_different_model_string_still_pulls() -> None:
    p = engine("p")
    d = engine("d", tiny(model="/other/mount/tiny-llama"),
               extra={"enforce_handshake_compat": False})

    async def scenario() -> None:
        async with started(p, d):
            outcome = await d.connector.pull(p.connector.hold("r", PROMPT), PROMPT)
            assert outcome.bytes_moved == 393216
            assert d.lines.having(
                f"NIXL compatibility check passed (hash: {p.geometry.compatibility_hash})")
    run(scenario)


def test_a_producer_gone_after_the_handshake_fails_with_remote_disconnect() -> None:
    p, d = engine("p"), engine("d")

    async def scenario() -> None:
        async with started(d):
            await p.connector.start()
            await d.connector.pull(p.connector.hold("req-1", PROMPT), PROMPT)
            params = p.connector.hold("req-2", PROMPT)
            await p.connector.stop()
            with pytest.raises(KvLoadFailed) as err:
                await d.connector.pull(params, PROMPT)
            assert err.value.log_line == failures.REMOTE_DISCONNECT
            assert d.lines.having("NIXL transfer failure: transfer_setup_failed. Marking blocks "
                                  "as invalid")
            assert d.metrics.failed == 1
    run(scenario)


def test_an_unread_lease_expires_and_the_late_pull_fails_naming_the_lease() -> None:
    p = engine("p", extra={"kv_lease_duration": 0.2})
    d = engine("d")

    async def scenario() -> None:
        async with started(p, d):
            params = p.connector.hold("req-late", PROMPT)
            await asyncio.sleep(0.6)
            assert p.lines.having("Releasing expired KV blocks for request req-late which were "
                                  "retrieved by 0 remote worker(s) before lease expired.")
            assert p.metrics.expired == 1 and len(p.connector.leases) == 0
            with pytest.raises(KvLoadFailed, match=r"req-late.*lease expired"):
                await d.connector.pull(params, PROMPT)
    run(scenario)


def test_dropping_the_lease_early_makes_the_consumers_pull_fail() -> None:
    p, d = engine("p"), engine("d")

    async def scenario() -> None:
        async with started(p, d):
            p.faults.drop_lease_early = True
            params = p.connector.hold("req-1", PROMPT)
            assert p.metrics.expired == 1
            with pytest.raises(KvLoadFailed, match="lease expired"):
                await d.connector.pull(params, PROMPT)
            p.faults.drop_lease_early = False
            assert (await d.connector.pull(p.connector.hold("req-2", PROMPT), PROMPT)).tokens
    run(scenario)


def test_a_stale_peer_fails_one_request_and_the_next_re_hand_shakes() -> None:
    p, d = engine("p", engine_id="prefill-1"), engine("d")

    async def scenario() -> None:
        async with started(p, d):
            await d.connector.pull(p.connector.hold("req-1", PROMPT), PROMPT)
            p.faults.stale_peer = True  # the producer's agent restarts, same engine_id
            params = p.connector.hold("req-2", PROMPT)
            with pytest.raises(KvLoadFailed, match="NIXL_ERR_REMOTE_DISCONNECT"):
                await d.connector.pull(params, PROMPT)
            outcome = await d.connector.pull(p.connector.hold("req-3", PROMPT), PROMPT)
            assert outcome.handshake_seconds > 0  # a fresh handshake
            assert len(d.lines.having("NIXL compatibility check passed")) == 2
            assert d.metrics.failed == 1 and len(d.metrics.done) == 2
    run(scenario)


def test_recompute_instead_of_pull_moves_nothing_and_reports_zero_tokens() -> None:
    p, d = engine("p"), engine("d")

    async def scenario() -> None:
        async with started(p, d):
            d.faults.recompute_instead_of_pull = True
            params = p.connector.hold("req-1", PROMPT)
            assert d.connector.remote_verdict(params) == "pull"
            outcome = await d.connector.pull(params, PROMPT)
            assert (outcome.tokens, outcome.bytes_moved) == (0, 0)
            assert len(p.connector.leases) == 1  # left to expire, as on a real fleet
            assert not d.lines.having("NIXL compatibility check passed")
    run(scenario)


def test_a_consumer_cannot_read_blocks_the_producer_does_not_hold_for_that_request() -> None:
    p, d = engine("p"), engine("d")

    async def scenario() -> None:
        async with started(p, d):
            params = p.connector.hold("req-1", PROMPT)
            with pytest.raises(KvLoadFailed, match=r"refused the read \(blocks\)"):
                await d.connector.pull({**params, "remote_block_ids": [[999]]}, PROMPT)
            with pytest.raises(KvLoadFailed, match="does not know the request"):
                await d.connector.pull({**params, "remote_request_id": "nope"}, PROMPT)
            assert len(p.connector.leases) == 1
    run(scenario)


def test_params_naming_another_engine_id_fail_the_engine_id_check() -> None:
    p, d = engine("p"), engine("d")

    async def scenario() -> None:
        async with started(p, d):
            params = {**p.connector.hold("req-1", PROMPT), "remote_engine_id": "someone-else"}
            with pytest.raises(KvLoadFailed, match=r"Remote NIXL agent engine ID mismatch\. "
                                                   r"Expected someone-else,received"):
                await d.connector.pull(params, PROMPT)
    run(scenario)



def test_garbage_on_the_block_port_is_dropped_and_later_pulls_still_work() -> None:
    p, d = engine("p"), engine("d")

    async def scenario() -> None:
        async with started(p, d):
            await d.connector.pull(p.connector.hold("req-1", PROMPT), PROMPT)
            reply = (await asyncio.to_thread(probe, target(p)))[(0, 0)]
            blob = AgentBlob.decode(reply.metadata["agent_metadata"])
            for junk in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x02\xc1\xc1",
                         b"\x00\x00\x00\x01\x07", b"\x00\x00\x00\x03\x91\x91\x01"):
                reader, writer = await asyncio.open_connection(blob.host, blob.port)
                writer.write(junk)
                await writer.drain()
                assert await asyncio.wait_for(reader.read(), 2.0) == b""  # closed on us
                writer.close()
            outcome = await d.connector.pull(p.connector.hold("req-2", PROMPT), PROMPT)
            assert outcome.bytes_moved == 393216
    run(scenario)


def test_an_unreachable_remote_host_fails_the_pull_cleanly() -> None:
    p, d = engine("p"), engine("d", handshake_timeout_s=0.3)

    async def scenario() -> None:
        async with started(p, d):
            params = {**p.connector.hold("req-1", PROMPT), "remote_host": "no-such-host.invalid"}
            with pytest.raises(KvLoadFailed):
                await d.connector.pull(params, PROMPT)
            assert d.metrics.failed == 1
    run(scenario)
