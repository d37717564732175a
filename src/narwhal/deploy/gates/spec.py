"""What a gate declares: what defines it, what makes its pass stale, what its pass clears, and
how it can redo part of its work.

The runbook's "Repeat work when its measured input changes" table is these declarations read
by deploy/ledger/status.py; nothing else in deploy knows a staleness rule. Four kinds of input
make a passed gate stale:
- `inputs`: `.env` inputs (names computed by deploy.inputs.fingerprints), digested at its pass;
- `reads`: artifacts of earlier gates' passed attempts, digested likewise;
- `measured`: inputs judged against its record now (a workload beyond the profiled range);
- `live`: findings read from the hosts (an engine restarted, a link moved, a router down).
A stale gate makes every later passed gate stale too, unless each moved input is one of its
`verdict_only` inputs (it only re-judges its own measurements: what later gates read stands).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from narwhal.core.gates import GATE_NAMES, gate

if TYPE_CHECKING:
    from narwhal.deploy.inputs.model import Inputs
    from narwhal.deploy.ledger import Ledger


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
class Finding:
    """One thing the live check found moved that the record cannot see."""

    kind: str  # a LiveRule's kind, e.g. "engine-restarted", "link-moved"
    subject: str  # what moved: an engine id, a directed edge, "router"
    detail: str  # why, in the live check's words


@dataclass(frozen=True)
class LiveRule:
    """A kind of live finding that makes a passed gate stale, and how its cause reads:
    `prefix` then each finding through `item` (format fields: subject, detail) joined by
    `sep`, then `suffix`."""

    kind: str
    prefix: str
    item: str = "{subject}"
    sep: str = ", "
    suffix: str = ""

    def cause(self, findings: Sequence[Finding]) -> str:
        """The cause this rule gives for `findings` (those of its kind), "" for none."""
        mine = [f for f in findings if f.kind == self.kind]
        if not mine:
            return ""
        items = self.sep.join(self.item.format(subject=f.subject, detail=f.detail) for f in mine)
        return f"{self.prefix}{items}{self.suffix}"


# A measured input: why the gate's passed record no longer holds, read from the record and the
# inputs now; "" when it holds.
Judge = Callable[["Inputs", "Ledger"], str]


@dataclass(frozen=True)
class Measured:
    name: str
    judge: Judge


@dataclass(frozen=True)
class Partial:
    """How a gate redoes only part of its work: each finding kind names the option that
    receives its subjects (`narwhal engines --recapture engine-2`). `plan_key` is the key a
    partial attempt's plan holds, so that a partial attempt that did not pass is partial again
    while nothing it reads moved."""

    options: tuple[tuple[str, str], ...]  # (finding kind, option name)
    plan_key: str

    def subjects(self, findings: Sequence[Finding]) -> dict[str, list[str]]:
        """Option name -> the subjects of the findings it receives (options with none left
        out)."""
        out: dict[str, list[str]] = {}
        for kind, option in self.options:
            named = [f.subject for f in findings if f.kind == kind]
            if named:
                out.setdefault(option, []).extend(named)
        return out


@dataclass(frozen=True)
class GateSpec:
    name: str
    inputs: tuple[str, ...] = ()
    verdict_only: tuple[str, ...] = ()
    reads: tuple[Reads, ...] = ()
    measured: tuple[Measured, ...] = ()
    live: tuple[LiveRule, ...] = ()
    clears: tuple[str, ...] = ()  # finding kinds this gate's pass settles
    partial: Partial | None = None
    # a note on a moved verdict-only input: what re-judging means now (the edges Gate D
    # measures again), read from the record
    explain: Mapping[str, Judge] | None = None
    letter: str = ""  # the runbook's letter; a gate of the runbook gets its own by default

    def __post_init__(self) -> None:
        if not self.letter and self.name in GATE_NAMES:
            object.__setattr__(self, "letter", gate(self.name).letter)
        if not set(self.verdict_only) <= set(self.inputs):
            raise ValueError(f"gate {self.name}: verdict-only inputs must be among its inputs")
        kinds = {rule.kind for rule in self.live}
        if self.partial and not {k for k, _ in self.partial.options} <= kinds:
            raise ValueError(f"gate {self.name}: a partial re-run follows only its live kinds")

    def live_cause(self, findings: Sequence[Finding]) -> str:
        """Why the live findings make this gate stale ("" when none concerns it)."""
        return "; ".join(c for c in (rule.cause(findings) for rule in self.live) if c)


def sequence(*specs: GateSpec) -> dict[str, GateSpec]:
    """The gates in the order they run, by name; a gate may read only from gates before it."""
    names = [spec.name for spec in specs]
    for spec in specs:
        for read in spec.reads:
            if read.gate not in names or names.index(read.gate) >= names.index(spec.name):
                raise ValueError(f"gate {spec.name} cannot read from {read.gate}, which does "
                                 "not run before it")
    return {spec.name: spec for spec in specs}
