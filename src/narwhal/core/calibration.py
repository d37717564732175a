"""The first-token calibration (`narwhal.first-token-calibration` v1).

`narwhal-check --calibrate-first-token` measures, pair by pair and at several prompt lengths,
how long a client waits for the first token of a P/D handoff (producer leg plus the consumer's
first token) and derives a candidate deadline by a rule it writes into the document in words.
What the router does with it (refuse a fleet whose first-token deadline is below the
candidate) is serve/router/calibrated_deadline.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, Field

from narwhal.core.document_io import StrictModel, read_json_document, validate_document
from narwhal.core.profiles import Generation

SCHEMA = "narwhal.first-token-calibration"
VERSION = 1
REFERENCE = "docs/preflight.md"  # where the fields are described


class LengthSamples(StrictModel):
    """The first-token times of one pair at one prompt length, in measurement order."""

    prompt_tokens: int = Field(ge=1, le=10_000_000)
    samples_s: tuple[float, ...] = Field(min_length=1, max_length=10_000)
    p95_s: float = Field(ge=0)


class PairSamples(StrictModel):
    """One ordered producer -> consumer pair's samples at every calibrated length."""

    producer: str = Field(min_length=1, max_length=64)
    consumer: str = Field(min_length=1, max_length=64)
    lengths: tuple[LengthSamples, ...] = Field(min_length=1, max_length=64)


class EngineGeneration(StrictModel):
    engine_id: str = Field(min_length=1, max_length=64)
    generation: Generation


class Calibration(StrictModel):
    """`narwhal.first-token-calibration` v1."""

    schema_: Literal["narwhal.first-token-calibration"] = Field(alias="schema")
    schema_version: Literal[1]
    model: str = Field(min_length=1, max_length=256)
    candidate_s: float = Field(gt=0, le=3600)
    rule: str = Field(min_length=1, max_length=1000)
    safety_factor: float = Field(ge=1, le=100)
    pairs: tuple[PairSamples, ...] = Field(min_length=1, max_length=1_048_576)
    generations: tuple[EngineGeneration, ...] = Field(min_length=1, max_length=1024)
    measured_at: AwareDatetime

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def parse_calibration(raw: Any, source: str) -> Calibration:
    return validate_document(raw, source, Calibration, SCHEMA, VERSION,
                             f"write a {SCHEMA} v{VERSION} object (run narwhal-check "
                             "--calibrate-first-token)",
                             f"re-run narwhal-check --calibrate-first-token (it writes v{VERSION})",
                             reference=REFERENCE)


def load_calibration(path: Path) -> Calibration:
    """Read and validate a calibration document; InputError names the file and the fix."""
    source = str(path)
    raw = read_json_document(path, "run narwhal-check --fleet FLEET.json --calibrate-first-token "
                                   "to write it, or remove the fleet's calibration section")
    return parse_calibration(raw, source)
