"""vLLM's KV cache events on the wire: what an engine started with `--kv-events-config` publishes.

vLLM 0.29 and 0.32 (vllm/distributed/kv_events.py) send each batch as one ZMQ multipart
message: the topic, an 8-byte big-endian sequence number, and a msgpack payload. The payload is
msgspec's array-like `KVEventBatch` `[ts, events, data_parallel_rank]`; each event is a map
tagged by `type`: `BlockStored`, `BlockRemoved` or `AllBlocksCleared`. 0.32 adds `session_id`
to `BlockStored`; the fields a router needs are the same in both. An engine's block hash is
bytes or an int (`ExternalBlockHash`) and depends on its hash seed and algorithm, so a reader
never compares it across engines: the router keys blocks by its own chain over `token_ids` and
keeps the engine's hash only to apply that engine's `BlockRemoved`.

This module is the one place that knows that format: the emulator encodes with it, the router
decodes with it. Decoding is bounded (payload bytes, events per batch, blocks per event, token
ids) and strict: a frame that breaks the format is refused whole with `EventFormatError`, since
the reader cannot know which blocks it would have described.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack
from pydantic import Field, ValidationError, field_validator

from narwhal.core.document_io import StrictModel

MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
MAX_EVENTS = 65536
MAX_BLOCKS_PER_EVENT = 65536
MAX_TOKENS_PER_EVENT = 1 << 20
MAX_BLOCK_SIZE = 4096
MAX_HASH_BYTES = 64
MAX_TOKEN_ID = 2**32 - 1
MAX_NAME_CHARS = 256
SEQ_BYTES = 8

EngineHash = bytes | int


class EventFormatError(ValueError):
    """A frame that is not a vLLM KV event batch within this reader's bounds."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks an engine cached, in prefix order, with the token ids they hold."""

    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None  # e.g. "full_attention" (vLLM 0.32)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks an engine evicted, named by its own hashes."""

    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (`/reset_prefix_cache`, a restart)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    seq: int
    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


class EventsConfig(StrictModel):
    """`--kv-events-config` as vLLM's KVEventsConfig reads it (its keys, its defaults)."""

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None
    endpoint: str = Field(default="tcp://*:5557", min_length=1, max_length=256)
    replay_endpoint: str | None = Field(default=None, max_length=256)
    buffer_steps: int = Field(default=10_000, ge=1, le=10_000_000)
    hwm: int = Field(default=100_000, ge=0, le=10_000_000)
    max_queue_size: int = Field(default=100_000, ge=1, le=10_000_000)
    topic: str = Field(default="", max_length=MAX_NAME_CHARS)

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_transport(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"{value!r} is not a ZMQ endpoint (tcp://, ipc:// or inproc://)")
        return value

    @property
    def publishes(self) -> bool:
        """Whether the engine sends events a router can subscribe to (vLLM's publisher rule)."""
        publisher = self.publisher or ("zmq" if self.enable_kv_cache_events else "null")
        return self.enable_kv_cache_events and publisher == "zmq"


def parse_events_config(text: str) -> EventsConfig:
    """The `--kv-events-config` JSON; ValueError naming the key that vLLM would refuse."""
    try:
        return EventsConfig.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise ValueError(f"--kv-events-config: {where}: {first['msg']}") from None


# --- decoding ---------------------------------------------------------------------------


def _unpack(payload: bytes) -> Any:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise EventFormatError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD_BYTES}")
    try:
        return msgpack.unpackb(
            payload, raw=False, strict_map_key=True, use_list=True,
            max_str_len=MAX_NAME_CHARS * 4, max_bin_len=MAX_HASH_BYTES,
            max_array_len=MAX_TOKENS_PER_EVENT,
            max_map_len=64, max_ext_len=0)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            TypeError) as exc:
        raise EventFormatError(f"payload is not msgpack within bounds: {exc}") from None


def _int(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise EventFormatError(f"{what} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _optional_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what, 0, 1 << 16)


def _name(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_NAME_CHARS:
        raise EventFormatError(f"{what} must be a string of at most {MAX_NAME_CHARS} chars")
    return value


def _hash(value: Any) -> EngineHash:
    if isinstance(value, bytes) and 0 < len(value) <= MAX_HASH_BYTES:
        return value
    if type(value) is int and -(1 << 63) <= value < (1 << 64):
        return value
    raise EventFormatError(f"a block hash must be bytes or a 64-bit integer, got {value!r:.60}")


def _hashes(value: Any) -> tuple[EngineHash, ...]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_BLOCKS_PER_EVENT:
        raise EventFormatError("block_hashes must be a non-empty list within bounds")
    return tuple(_hash(h) for h in value)


def _stored(item: Mapping[str, Any]) -> BlockStored:
    hashes = _hashes(item.get("block_hashes"))
    block_size = _int(item.get("block_size"), "block_size", 1, MAX_BLOCK_SIZE)
    tokens = item.get("token_ids")
    if len(hashes) * block_size > MAX_TOKENS_PER_EVENT:
        raise EventFormatError(f"BlockStored of {len(hashes)} x {block_size} tokens is over "
                               f"{MAX_TOKENS_PER_EVENT} tokens")
    if not isinstance(tokens, list) or len(tokens) != len(hashes) * block_size:
        raise EventFormatError(
            f"BlockStored carries {len(hashes)} block(s) of {block_size} tokens, so "
            f"token_ids must hold {len(hashes) * block_size} ids")
    for t in tokens:
        if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
            raise EventFormatError(f"token id {t!r:.40} is not an integer in [0, {MAX_TOKEN_ID}]")
    parent = item.get("parent_block_hash")
    return BlockStored(
        hashes, None if parent is None else _hash(parent), tuple(tokens), block_size,
        _name(item.get("medium"), "medium"), _name(item.get("lora_name"), "lora_name"),
        _optional_int(item.get("group_idx"), "group_idx"),
        _name(item.get("kv_cache_spec_kind"), "kv_cache_spec_kind"))


def _event(item: Any) -> Event:
    if not isinstance(item, dict):
        raise EventFormatError(f"an event must be a map tagged by 'type', got {type(item).__name__}")
    kind = item.get("type")
    if kind == "BlockStored":
        return _stored(item)
    if kind == "BlockRemoved":
        return BlockRemoved(_hashes(item.get("block_hashes")), _name(item.get("medium"), "medium"),
                            _optional_int(item.get("group_idx"), "group_idx"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise EventFormatError(f"unknown event type {kind!r:.60}")


def decode_batch(seq: int, payload: bytes) -> EventBatch:
    """One batch's payload, refused whole when any part of it breaks the format."""
    value = _unpack(payload)
    if not isinstance(value, list) or len(value) not in (2, 3):
        raise EventFormatError("a batch must be the array [ts, events, data_parallel_rank]")
    ts, events = value[0], value[1]
    if type(ts) not in (float, int):
        raise EventFormatError(f"batch ts must be a number, got {ts!r:.40}")
    if not isinstance(events, list) or len(events) > MAX_EVENTS:
        raise EventFormatError(f"batch events must be a list of at most {MAX_EVENTS}")
    rank = _optional_int(value[2], "data_parallel_rank") if len(value) == 3 else None
    return EventBatch(seq, float(ts), tuple(_event(e) for e in events), rank)


def decode_frames(frames: Sequence[bytes]) -> tuple[bytes, EventBatch]:
    """The topic and batch of one multipart message (topic, sequence, payload)."""
    if len(frames) != 3:
        raise EventFormatError(f"a KV event message has 3 frames, got {len(frames)}")
    topic, seq_bytes, payload = frames
    if len(seq_bytes) != SEQ_BYTES:
        raise EventFormatError(f"the sequence frame must be {SEQ_BYTES} bytes")
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    return topic, decode_batch(seq, payload)


# --- encoding (the emulator's publisher) ------------------------------------------------


def _event_map(event: Event) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        # vLLM 0.32 omits fields at their default (msgspec omit_defaults) and writes one
        # extra_keys entry per block (None without LoRA, multimodal or cache salt)
        optional = {"group_idx": event.group_idx,
                    "kv_cache_spec_kind": event.kv_cache_spec_kind}
        return {"type": "BlockStored", "block_hashes": list(event.block_hashes),
                "parent_block_hash": event.parent_block_hash,
                "token_ids": list(event.token_ids), "block_size": event.block_size,
                "lora_id": None, "medium": event.medium, "lora_name": event.lora_name,
                "extra_keys": [None] * len(event.block_hashes),
                **{k: v for k, v in optional.items() if v is not None}}
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes),
                "medium": event.medium,
                **({} if event.group_idx is None else {"group_idx": event.group_idx})}
    return {"type": "AllBlocksCleared"}


def encode_frames(topic: bytes, batch: EventBatch) -> list[bytes]:
    """The multipart message vLLM's ZmqEventPublisher sends for `batch`."""
    body: list[Any] = [batch.ts, [_event_map(e) for e in batch.events]]
    if batch.data_parallel_rank is not None:
        body.append(batch.data_parallel_rank)
    payload = msgpack.packb(body, use_bin_type=True)
    return [topic, batch.seq.to_bytes(SEQ_BYTES, "big", signed=True), payload]
