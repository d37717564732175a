"""vLLM's KV event wire format: real vLLM's bytes decode, ours re-encode, hostile frames refused."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from narwhal.core.kv.events import (
    MAX_EVENTS,
    MAX_PAYLOAD_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventFormatError,
    decode_batch,
    decode_frames,
    encode_frames,
    parse_events_config,
)

FIXTURE = Path(__file__).parents[2] / "fixtures" / "vllm-0.32.0" / "kv-events-batch.msgpack"


def test_a_batch_vllm_0_32_encoded_decodes_to_its_events() -> None:
    # written by vLLM 0.32's own KVEventBatch and msgspec encoder
    batch = decode_batch(3, FIXTURE.read_bytes())
    assert batch.seq == 3 and batch.ts == 1765000000.25 and batch.data_parallel_rank == 0
    stored, chained, removed, cleared = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (bytes(range(32)), 2**63 + 5)
    assert stored.parent_block_hash is None and stored.block_size == 16
    assert stored.token_ids == tuple(range(100, 132)) and stored.group_idx == 0
    assert isinstance(chained, BlockStored) and chained.parent_block_hash == 2**63 + 5
    assert removed == BlockRemoved((-7,), "GPU")
    assert cleared == AllBlocksCleared()


def test_what_the_emulator_encodes_decodes_to_the_same_batch() -> None:
    batch = EventBatch(9, 2.5, (
        BlockStored((11, 12), None, tuple(range(8)), 4, "GPU"),
        BlockRemoved((11,), "GPU"), AllBlocksCleared()), 0)
    topic, again = decode_frames(encode_frames(b"kv", batch))
    assert topic == b"kv" and again == batch


def _payload(events: list[object], ts: object = 1.0) -> bytes:
    return msgpack.packb([ts, events, 0], use_bin_type=True)


def _stored(**over: object) -> dict[str, object]:
    item: dict[str, object] = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                               "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None,
                               "medium": "GPU", "lora_name": None}
    item.update(over)
    return item


@pytest.mark.parametrize(("payload", "says"), [
    (b"\xc1", "msgpack"),
    (msgpack.packb({"ts": 1}), "array"),
    (_payload([_stored()], ts="now"), "ts"),
    (_payload([{"type": "BlockEvicted", "block_hashes": [1]}]), "unknown event type"),
    (_payload([["BlockStored", [1], None, [1, 2, 3, 4], 4]]), "map tagged"),
    (_payload([_stored(token_ids=[1, 2, 3])]), "must hold 4 ids"),
    (_payload([_stored(token_ids=[1, 2, 3, -1])]), "token id"),
    (_payload([_stored(token_ids=[1, 2, 3, 2**40])]), "token id"),
    (_payload([_stored(token_ids=[1, 2, 3, True])]), "token id"),
    (_payload([_stored(block_size=0, token_ids=[])]), "block_size"),
    (_payload([_stored(block_hashes=[])]), "non-empty"),
    (_payload([_stored(block_hashes=[b""])]), "block hash"),
    (_payload([_stored(block_hashes=[[1, 2]])]), "block hash"),
    (_payload([_stored(medium={"nested": "map"})]), "medium"),
    (_payload([_stored(block_size=4096, block_hashes=list(range(300)), token_ids=[])]),
     "over"),
])
def test_a_payload_that_breaks_the_format_is_refused_naming_the_part(
        payload: bytes, says: str) -> None:
    with pytest.raises(EventFormatError, match=says):
        decode_batch(0, payload)


def test_sizes_without_bound_are_refused_before_they_are_read() -> None:
    with pytest.raises(EventFormatError, match="over"):
        decode_batch(0, b"\x90" * (MAX_PAYLOAD_BYTES + 1))
    too_many = _payload([{"type": "AllBlocksCleared"}] * (MAX_EVENTS + 1))
    with pytest.raises(EventFormatError):
        decode_batch(0, too_many)
    # a declared length far beyond the bytes sent: refused, not allocated
    with pytest.raises(EventFormatError):
        decode_batch(0, b"\x93\xcb" + b"\0" * 8 + b"\xdd\xff\xff\xff\xff")


def test_nesting_without_bound_is_refused() -> None:
    deep = b"\x91" * 100_000 + b"\xc0"
    with pytest.raises(EventFormatError):
        decode_batch(0, deep)


@pytest.mark.parametrize("frames", [
    [b"kv", b"\0" * 8], [b"kv", b"\0" * 7, _payload([])], [b"", b"\0" * 8, _payload([]), b"x"]])
def test_a_message_without_its_three_frames_is_refused(frames: list[bytes]) -> None:
    with pytest.raises(EventFormatError):
        decode_frames(frames)


def test_the_events_config_reads_vllm_s_keys_and_refuses_others() -> None:
    cfg = parse_events_config('{"enable_kv_cache_events": true, "publisher": "zmq", '
                              '"endpoint": "tcp://*:5557", "topic": "kv"}')
    assert cfg.publishes and cfg.topic == "kv"
    assert parse_events_config('{"enable_kv_cache_events": true}').publishes
    assert not parse_events_config('{"enable_kv_cache_events": true, "publisher": "null"}').publishes
    assert not parse_events_config("{}").publishes
    with pytest.raises(ValueError, match="enable_kv_cache_event"):
        parse_events_config('{"enable_kv_cache_event": true}')
    with pytest.raises(ValueError, match="endpoint"):
        parse_events_config('{"endpoint": "http://x:1"}')
    with pytest.raises(ValueError, match="hwm"):
        parse_events_config('{"hwm": "1e9"}')


LIVE = Path(__file__).parents[2] / "fixtures" / "vllm-0.32.0" / "kv-events-live-batch.msgpack"


def test_a_batch_a_live_vllm_0_32_cpu_engine_published_decodes() -> None:
    # captured from the real tier's engine (tiny llama, 128-token blocks, one 300-token prompt)
    batch = decode_batch(0, LIVE.read_bytes())
    (stored,) = batch.events
    assert isinstance(stored, BlockStored) and stored.block_size == 128
    assert len(stored.block_hashes) == 2 and len(stored.token_ids) == 256
    assert stored.group_idx == 0 and stored.kv_cache_spec_kind == "full_attention"
