"""The fabric budget of Gate D: Gbit/s one directed edge must carry for the planned handoffs.

required = 8 * payload * max(rate, burst / T) * headroom / 1e9, with payload = the bytes all
consumer ranks read for one handoff. The payload comes from the geometry (MLA, hybrid and
heterogeneous TP included) or, in uniform mode, from bytes per token padded to whole blocks.
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from narwhal.core.document_io import StrictModel
from narwhal.core.kv.blocks import cdiv
from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.transfer import request_transfer


class Workload(StrictModel):
    """The handoff load one directed edge must carry; NaN and infinity are refused."""

    prompt_tokens: int = Field(default=1024, ge=1)
    handoffs_per_s: float = Field(default=1.0, gt=0)
    burst: int = Field(default=1, ge=1)
    transfer_budget_s: float = Field(default=1.0, gt=0)
    headroom: float = Field(default=1.25, ge=1)

    @field_validator("handoffs_per_s", "transfer_budget_s", "headroom", mode="before")
    @classmethod
    def _finite(cls, value: object) -> object:
        # NaN passes every range check, so it is refused by name first.
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value

    @property
    def peak_handoffs_per_s(self) -> float:
        return max(self.handoffs_per_s, self.burst / self.transfer_budget_s)


class Budget(StrictModel):
    """A computed budget for one directed edge."""

    payload_bytes_per_handoff: int
    peak_handoffs_per_s: float
    required_gbps: float
    workload: Workload


def required_gbps(payload_bytes: int, workload: Workload) -> Budget:
    """Decimal Gbit/s for `payload_bytes` per handoff under `workload`."""
    if payload_bytes <= 0:
        raise ValueError("a handoff that moves no bytes cannot be budgeted")
    peak = workload.peak_handoffs_per_s
    gbps = 8 * payload_bytes * peak * workload.headroom / 1e9
    return Budget(payload_bytes_per_handoff=payload_bytes, peak_handoffs_per_s=peak,
                  required_gbps=gbps, workload=workload)


def uniform_payload(bytes_per_token: int, prompt_tokens: int, block_tokens: int) -> int:
    """Uniform mode: all-rank bytes per token times the prompt padded up to whole blocks."""
    return bytes_per_token * cdiv(prompt_tokens, block_tokens) * block_tokens


def edge_budget(consumer: Geometry, workload: Workload) -> Budget:
    """Budget for handoffs into `consumer`: every consumer rank reads its own page per block."""
    payload = request_transfer(consumer, workload.prompt_tokens).total_bytes
    return required_gbps(payload, workload)
