"""The live KV canary's reference (`narwhal.kv-canary` v1).

`narwhal-check --calibrate-first-token` records it at preflight: one fixed greedy probe (a
prompt several KV blocks long), sent through every ordered producer -> consumer pair with the
consumer's counters proving the KV moved, and the answer every pair gave: its text, and the
logprob of each token where the engine gives them. Every pair must give the same answer, or
the calibration fails naming the pairs that differ. The router then sends the same probe to
each pair at a low rate while it serves and holds out of placement a pair whose answer
differs, whose consumer recomputed the prompt instead of pulling it, or that fails
(serve/router/canary/).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, Field

from narwhal.core.document_io import StrictModel, read_json_document, validate_document

SCHEMA = "narwhal.kv-canary"
VERSION = 1
REFERENCE = "docs/router.md"  # where the fields are described
# How far a token's logprob may be from the reference's (the fleet's kv_canary default, and
# what preflight holds the pairs to when it records the reference)
LOGPROB_TOLERANCE = 1e-3


class CanaryPair(StrictModel):
    producer: str = Field(min_length=1, max_length=64)
    consumer: str = Field(min_length=1, max_length=64)
    first_token_s: float = Field(ge=0, le=3600)


class KvCanary(StrictModel):
    """`narwhal.kv-canary` v1."""

    schema_: Literal["narwhal.kv-canary"] = Field(alias="schema")
    schema_version: Literal[1]
    model: str = Field(min_length=1, max_length=256)
    prompt: str = Field(min_length=1, max_length=1_000_000)
    prompt_tokens: int = Field(ge=1, le=10_000_000)
    max_tokens: int = Field(ge=1, le=4096)
    text: str = Field(max_length=1_000_000)
    token_logprobs: tuple[float | None, ...] | None = Field(default=None, max_length=4096)
    pairs: tuple[CanaryPair, ...] = Field(min_length=1, max_length=1_048_576)
    measured_at: AwareDatetime

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def parse_canary(raw: Any, source: str) -> KvCanary:
    return validate_document(raw, source, KvCanary, SCHEMA, VERSION,
                             f"write a {SCHEMA} v{VERSION} object (run narwhal-check "
                             "--calibrate-first-token --canary-out FILE)",
                             f"re-run narwhal-check --calibrate-first-token (it writes v{VERSION})",
                             reference=REFERENCE)


def load_canary(path: Path) -> KvCanary:
    """Read and validate a canary reference; InputError names the file and the fix."""
    raw = read_json_document(path, "run narwhal-check --fleet FLEET.json --calibrate-first-token "
                                   "--canary-out FILE to write it, or remove the fleet's "
                                   "kv_canary section")
    return parse_canary(raw, str(path))


def answer_logprobs(body: dict[str, Any]) -> list[Any] | None:
    """A completion's `choices[0].logprobs.token_logprobs` as the engine wrote it (None:
    it gave none)."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    logprobs = choices[0].get("logprobs")
    got = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    return got if isinstance(got, list) else None


def logprob_gap(want: tuple[float | None, ...] | list[float | None], got: list[Any],
                tolerance: float) -> str:
    """How `got` differs from the reference's logprobs beyond `tolerance`, in words ("": it
    does not); a token either side gives no logprob for is not compared."""
    if len(got) != len(want):
        return f"{len(got)} logprobs came back, the reference has {len(want)}"
    for k, (w, g) in enumerate(zip(want, got, strict=True)):
        if w is None or g is None:
            continue
        if not isinstance(g, int | float) or not math.isfinite(g) or abs(g - w) > tolerance:
            return f"token {k}'s logprob is {g!r}, the reference {w!r} (tolerance {tolerance:g})"
    return ""
