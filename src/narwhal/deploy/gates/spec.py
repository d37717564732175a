"""What a gate declares: its inputs, what it reads from earlier gates, how its work spreads."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from narwhal.core.gates import GATE_INPUTS, GATE_NAMES


class Spread(Enum):
    """How a gate's work is spread (the runbook's concurrency rules)."""

    PER_HOST = "per physical host, concurrently"
    PER_ENGINE = "per engine; engines that share a GPU one after another"
    PER_EDGE = "one directed edge at a time, every engine idle"
    SERIAL = "one step at a time"


@dataclass(frozen=True)
class Reads:
    """One artifact of an earlier gate's passed attempt that this gate reads."""

    gate: str
    artifact: str

    @property
    def key(self) -> str:
        """Its name in the reading gate's fingerprint."""
        return f"artifact:{self.gate}/{self.artifact}"


@dataclass(frozen=True)
class GateSpec:
    name: str
    spread: Spread
    reads: tuple[Reads, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in GATE_NAMES:
            raise ValueError(f"unknown gate {self.name!r}")
        for read in self.reads:
            if GATE_NAMES.index(read.gate) >= GATE_NAMES.index(self.name):
                raise ValueError(f"gate {self.name} cannot read from {read.gate}, which runs "
                                 "after it")

    @property
    def inputs(self) -> tuple[str, ...]:
        """The `.env` inputs (fingerprint names) that define this gate."""
        return GATE_INPUTS[self.name]
