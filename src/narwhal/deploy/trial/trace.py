"""A recorded trace replayed by the capacity trial (`narwhal trial --trace FILE`).

The format is the Mooncake trace's, as AIPerf reads it: one JSON object per line,
`{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`, one
hash_id per 512-token block of the prompt, equal hash_ids for equal block content. Real traffic
repeats itself (a conversation resends its history, tenants share system prompts), and a trace
is the only way a trial shows what the fleet does with that: unique synthetic prompts never hit
a cache.

The file is read whole before any session opens, bounded in every dimension (file size, line
length, rows, hash_ids per row, each number), and refused with the line and the field when it
is not that format: it is the operator's input and may be hostile or simply the wrong file.

Replay keeps the trace's order and relative timing, stretched so that the replayed rows offer
the trial's rate on average. Prompts are scaled to the fleet: a hash block becomes a fixed run
of words (the same hash_id always the same words, so equal hash_ids are equal token blocks
under any tokenizer that splits at spaces), sized so the trace's long prompts fit the profiled
range; output lengths are scaled alike and capped by --max-tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError

from narwhal.core.document_io import StrictModel
from narwhal.deploy.trial.client import WORDS
from narwhal.deploy.trial.schedule import Planned

TRACE_BLOCK_TOKENS = 512  # tokens per hash_id in the Mooncake traces
MAX_FILE_BYTES = 64 << 20
MAX_LINE_BYTES = 256 << 10
MAX_ROWS = 200_000
MAX_HASH_IDS = 4096  # per row: a 2M-token prompt at 512 tokens a block
MAX_TOKENS = 1 << 21
MAX_TIMESTAMP_MS = 10 ** 12  # about 31 years of trace
MIN_BLOCK_TOKENS = 16  # a replayed hash block is at least this many tokens
MIN_BLOCK_WORDS = 8  # so two hash_ids' word runs differ (16 words: 16^8 runs)
FIELDS = "timestamp, input_length, output_length, hash_ids"


class TraceError(ValueError):
    """The trace file cannot be replayed; the message names the file, line and field."""


class TraceRow(StrictModel):
    """One request of the trace."""

    timestamp: Annotated[float, Field(ge=0, le=MAX_TIMESTAMP_MS)]
    input_length: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    output_length: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    hash_ids: Annotated[list[Annotated[int, Field(ge=0, le=2 ** 63 - 1)]],
                        Field(min_length=1, max_length=MAX_HASH_IDS)]


@dataclass(frozen=True)
class Trace:
    """A validated trace: its rows in file order, with what names the file in the record."""

    name: str
    sha256: str
    rows: tuple[TraceRow, ...]


def _row(path: Path, number: int, line: bytes) -> TraceRow:
    where = f"{path}: line {number}"
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not JSON ({exc.msg}); each line is one object with "
                         f"{FIELDS}") from None
    except ValueError:  # bytes that are not UTF-8, or a number too long to convert
        raise TraceError(f"{where}: not a UTF-8 JSON object with {FIELDS}") from None
    if not isinstance(doc, dict):
        raise TraceError(f"{where}: a {type(doc).__name__}, not an object with {FIELDS}")
    try:
        return TraceRow.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "row"
        raise TraceError(f"{where}: {field}: {first['msg']} (the Mooncake trace format: "
                         f"{FIELDS})") from None


def _lines(path: Path, data: bytes) -> list[tuple[int, bytes]]:
    out = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if len(line) > MAX_LINE_BYTES:
            raise TraceError(f"{path}: line {number} is over {MAX_LINE_BYTES} bytes")
        stripped = line.strip()
        if stripped and not stripped.startswith(b"#"):
            out.append((number, stripped))
            if len(out) > MAX_ROWS:
                raise TraceError(f"{path}: over {MAX_ROWS} rows; cut the trace to the part "
                                 "to replay")
    return out


def read_trace(path: Path) -> Trace:
    """The trace at `path`, every row checked; TraceError naming the line and field."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise TraceError(f"{path}: over {MAX_FILE_BYTES >> 20} MiB; cut the trace to the part "
                         "to replay")
    rows: list[TraceRow] = []
    for number, line in _lines(path, data):
        row = _row(path, number, line)
        if rows and row.timestamp < rows[-1].timestamp:
            raise TraceError(f"{path}: line {number}: timestamp {row.timestamp:g} is before "
                             f"the row above ({rows[-1].timestamp:g}); a trace is in time order")
        rows.append(row)
    if not rows:
        raise TraceError(f"{path}: no rows (each line one object with {FIELDS})")
    return Trace(path.name, hashlib.sha256(data).hexdigest(), tuple(rows))


def arrival_times(timestamps_ms: Sequence[float], rate: float) -> list[float]:
    """Seconds after the start for each row: the trace's relative timing stretched so the rows
    offer `rate` per second on average; a trace whose rows share one timestamp is spread
    evenly at `rate`."""
    if rate <= 0 or not timestamps_ms:
        raise ValueError("arrival times need a positive rate and at least one row")
    t0, span_s = timestamps_ms[0], (timestamps_ms[-1] - timestamps_ms[0]) / 1000.0
    if span_s <= 0:
        return [n / rate for n in range(len(timestamps_ms))]
    stretch = (len(timestamps_ms) - 1) / span_s / rate
    return [(t - t0) / 1000.0 * stretch for t in timestamps_ms]


@dataclass(frozen=True)
class Scale:
    """How the trace maps onto this fleet: tokens and words per hash block, the most blocks a
    prompt keeps, and the output cap."""

    block_tokens: int
    block_words: int
    max_blocks: int
    max_tokens: int

    def output_tokens(self, row: TraceRow) -> int:
        return min(self.max_tokens,
                   max(1, round(row.output_length * self.block_tokens / TRACE_BLOCK_TOKENS)))


def block_tokens_for(rows: Sequence[TraceRow], prompt_tokens: int) -> int:
    """Tokens per hash block so that 95 in 100 of the rows' prompts fit `prompt_tokens` whole
    (the longest are cut), never under MIN_BLOCK_TOKENS."""
    blocks = sorted(len(r.hash_ids) for r in rows)
    p95 = blocks[min(len(blocks) - 1, math.ceil(0.95 * len(blocks)) - 1)]
    return max(MIN_BLOCK_TOKENS, prompt_tokens // max(p95, 1))


def _block_words(seed: int, hash_id: int, count: int) -> list[str]:
    rng = random.Random(f"trace:{seed}:{hash_id}")
    return rng.choices(WORDS, k=count)


def prompt_text(row: TraceRow, scale: Scale, seed: int) -> str:
    """The row's prompt: hash block k is word run k, the last cut where the input ends, blocks
    past max_blocks left out."""
    kept = row.hash_ids[:scale.max_blocks]
    words_total = max(1, math.ceil(row.input_length * scale.block_words / TRACE_BLOCK_TOKENS))
    words: list[str] = []
    for hash_id in kept:
        words += _block_words(seed, hash_id, scale.block_words)
    return " ".join(words[:words_total])


def replay(trace: Trace, rate: float, count: int, scale: Scale, seed: int,
           tag: str) -> list[Planned]:
    """The first `count` rows (all of them when the trace is shorter) as planned requests,
    ids `<tag>-<n>`, at the trace's timing stretched to `rate`."""
    rows = trace.rows[:max(1, count)]
    out = []
    for n, (row, at) in enumerate(zip(rows, arrival_times([r.timestamp for r in rows], rate),
                                      strict=True)):
        text = prompt_text(row, scale, seed)
        out.append(Planned(f"{tag}-{n:05d}", at, len(text.split()), scale.output_tokens(row),
                           prompt=text))
    return out


def reuse(rows: Sequence[TraceRow], max_blocks: int) -> dict[str, Any]:
    """What the replayed rows repeat: the share of their kept hash blocks that an earlier row
    already sent (chained: a block repeats only with its whole prefix), the ceiling of any
    cache, and how many rows were cut."""
    seen: set[tuple[int, int]] = set()
    repeated = total = cut = 0
    for row in rows:
        kept = row.hash_ids[:max_blocks]
        cut += len(kept) < len(row.hash_ids)
        parent = 0
        for hash_id in kept:
            key = (parent, hash_id)
            repeated += key in seen
            seen.add(key)
            parent = hash(key)
        total += len(kept)
    return {"rows": len(rows), "blocks": total, "repeated_block_share":
            round(repeated / total, 4) if total else 0.0, "rows_cut": cut}
