"""The profile store (`narwhal.profiles` v1): each engine's measured cost curves and the
generation of the engine they were measured on.

narwhal-profile writes it; the router reads it. A curve describes one engine *process*: a
restarted engine may load another build, another kernel cache or another memory layout, so
each row names the generation it measured (engine version from `GET /version` plus
`process_start_time_seconds` from `GET /metrics`, and an attestation digest once Gate E
exists). The router never prices an engine from a row whose generation is not the live one.

Curves, in seconds:
- prefill: `a + b*n + c*n^2` for a prompt of `n` tokens (attention makes it quadratic);
- decode: one step costs `base + per_token * resident_tokens + per_request * running`,
  where `resident_tokens` is the KV held by the requests decoding on the engine.

Like the fleet document, the store is strict and closed: unknown keys, numbers in quotes,
NaN/Infinity and negative coefficients are refused, every problem at once.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, Field, field_validator

from narwhal.core.document_io import StrictModel, read_json_document, validate_document
from narwhal.core.documents import digest
from narwhal.core.errors import InputError, Problem

SCHEMA = "narwhal.profiles"
VERSION = 1
REFERENCE = "docs/profile.md"  # where the fields are described
_ATTESTATION = re.compile(r"^sha256:[0-9a-f]{64}$")


class Generation(StrictModel):
    """Which engine process a row measured; equal generations mean the same process."""

    engine_version: str = Field(min_length=1, max_length=128)
    process_start_time_seconds: float = Field(gt=0)
    attestation_digest: str | None = None  # reserved for Gate E (sha256:<hex> of the attestation)

    @field_validator("attestation_digest")
    @classmethod
    def _digest_shape(cls, value: str | None) -> str | None:
        if value is not None and not _ATTESTATION.match(value):
            raise ValueError("must be sha256: followed by 64 lowercase hex digits")
        return value

    def digest(self) -> str:
        return digest(self.model_dump())

    def describe(self) -> str:
        return (f"version {self.engine_version}, started at {self.process_start_time_seconds:.2f}"
                + (f", attested {self.attestation_digest[:19]}" if self.attestation_digest else ""))


class _Fit(StrictModel):
    fit_error: float = Field(ge=0, le=10)  # relative RMS error of the fit over its own samples
    loo_error: float = Field(ge=0, le=10)  # relative RMS leave-one-out error
    samples: int = Field(ge=3, le=1_000_000)


class PrefillCurve(_Fit):
    """Prefill time of an `n`-token prompt: `a_s + b_s_per_token*n + c_s_per_token2*n^2`."""

    a_s: float = Field(ge=0, le=600)
    b_s_per_token: float = Field(ge=0, le=1)
    c_s_per_token2: float = Field(ge=0, le=1)
    max_prompt_tokens: int = Field(ge=1, le=10_000_000)  # the largest prompt measured

    def seconds(self, n: int) -> float:
        return self.a_s + self.b_s_per_token * n + self.c_s_per_token2 * n * n


class DecodeCurve(_Fit):
    """One decode step: `base_s + per_token_s*resident_tokens + per_request_s*running`."""

    base_s: float = Field(ge=0, le=60)
    per_token_s: float = Field(ge=0, le=1)
    per_request_s: float = Field(ge=0, le=60)
    max_requests: int = Field(ge=1, le=1_000_000)  # the most concurrent requests measured
    max_resident_tokens: int = Field(ge=1, le=1_000_000_000)

    def step_s(self, resident_tokens: int, running: int) -> float:
        return self.base_s + self.per_token_s * resident_tokens + self.per_request_s * running


class ProfileRow(StrictModel):
    """One engine's curves, bound to the generation they were measured on."""

    engine_id: str = Field(min_length=1, max_length=64)
    generation: Generation
    prefill: PrefillCurve
    decode: DecodeCurve
    measured_at: AwareDatetime


class ProfileStore(StrictModel):
    """`narwhal.profiles` v1: one row per engine."""

    schema_: Literal["narwhal.profiles"] = Field(alias="schema")
    schema_version: Literal[1]
    model: str = Field(min_length=1, max_length=256)
    profiles: tuple[ProfileRow, ...] = Field(max_length=1024)

    def row(self, engine_id: str) -> ProfileRow | None:
        return next((r for r in self.profiles if r.engine_id == engine_id), None)

    def document(self) -> dict[str, Any]:
        """The JSON-ready document (what narwhal-profile writes)."""
        return self.model_dump(mode="json", by_alias=True)


def parse_profiles(raw: Any, source: str, *, model: str | None = None,
                   engine_ids: tuple[str, ...] | None = None) -> ProfileStore:
    """Validate a parsed document; with `model`/`engine_ids`, also check it fits that fleet."""
    store = validate_document(
        raw, source, ProfileStore, SCHEMA, VERSION,
        f"write a {SCHEMA} v{VERSION} object (run narwhal-profile)",
        f"re-run narwhal-profile from this revision (it writes version {VERSION})",
        reference=REFERENCE)
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for i, row in enumerate(store.profiles):
        if row.engine_id in seen:
            problems.append(Problem(f"profiles[{i}].engine_id",
                                    f"{row.engine_id!r} repeats profiles[{seen[row.engine_id]}]",
                                    "keep one row per engine"))
        seen.setdefault(row.engine_id, i)
        if engine_ids is not None and row.engine_id not in engine_ids:
            problems.append(Problem(f"profiles[{i}].engine_id",
                                    f"{row.engine_id!r} is not an engine of this fleet",
                                    f"profile this fleet's engines ({', '.join(engine_ids)})"))
    if model is not None and store.model != model:
        problems.append(Problem("model", f"{store.model!r} is not the fleet's model {model!r}",
                                "profile the engines that serve this fleet's model"))
    if problems:
        raise InputError(source, problems)
    return store


def load_profiles(path: Path, *, model: str | None = None,
                  engine_ids: tuple[str, ...] | None = None) -> ProfileStore:
    raw = read_json_document(path, "run narwhal-profile --fleet FLEET.json to write it")
    return parse_profiles(raw, str(path), model=model, engine_ids=engine_ids)


def now_utc() -> datetime:
    """`measured_at` for a row measured now."""
    return datetime.now(UTC)
