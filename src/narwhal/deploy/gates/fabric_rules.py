"""Gate D's rules, apart from its I/O: an edge's verdict, and when an earlier sample is reused.

Both are looked up without a host, a clock or the ledger, so a unit test walks every case;
fabric.py's execute gathers the facts (the link record, the sample, the idle proofs, the
previous rows) and carries out what these return.

Verdict, in this order: traffic on any engine around the sample voids it (the rate says
nothing about the fabric); otherwise an edge passes only when its route is the fabric and the
measured rate meets the budget; anything else fails. Reuse: the edge's latest sample is
reused only when it passed, under the same link fingerprint (the test parameters are part of
the link record), still meets the budget of now, and was not named in --resample; the first
rule that refuses names why. Idle proofs: every engine is asked before and after each window
of edges (`proof_windows`), and a window whose counters moved is sampled again edge by edge. (The margin, measured over required, is the matrix row's own:
deploy/fabric/matrix.py.)
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol, TypeVar

from narwhal.core.fabric_edges import Verdict


def meets(measured_gbps: float | None, required_gbps: float) -> bool:
    """A sample meets the budget: it has a rate, and the rate is at least the requirement."""
    return measured_gbps is not None and measured_gbps >= required_gbps


def edge_verdict(measured_gbps: float | None, required_gbps: float, *, route_ok: bool,
                 traffic: bool) -> Verdict:
    """A measured edge's verdict (the order is the module's rule)."""
    if traffic:
        return "void"
    if route_ok and meets(measured_gbps, required_gbps):
        return "pass"
    return "fail"


class Reuse(Enum):
    """Whether an edge's last sample is reused, and if not, the first reason it is not."""

    REUSED = "reused"
    NO_SAMPLE = "no earlier sample"
    NOT_PASSED = "the last sample did not pass"
    LINK_MOVED = "the link record moved"
    BELOW_BUDGET = "the last sample does not meet the budget of now"
    RESAMPLE = "named in --resample"


class PriorSample(Protocol):
    """What the reuse rule reads of an edge's latest recorded row (a matrix.EdgeRow)."""

    @property
    def verdict(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def measured_gbps(self) -> float | None: ...


def sample_reuse(last: PriorSample | None, fingerprint: str, required_gbps: float,
                 resampled: bool) -> Reuse:
    """The reuse rule: `fingerprint` is the edge's link record now, `required_gbps` its budget
    now, `resampled` whether --resample names it."""
    if last is None:
        return Reuse.NO_SAMPLE
    if last.verdict != "pass":
        return Reuse.NOT_PASSED
    if last.fingerprint != fingerprint:
        return Reuse.LINK_MOVED
    if not meets(last.measured_gbps, required_gbps):
        return Reuse.BELOW_BUDGET
    if resampled:
        return Reuse.RESAMPLE
    return Reuse.REUSED


def resample_refusal(edge: str, last: PriorSample | None, diagnosed: bool) -> str | None:
    """Why --resample EDGE is refused (None: it is not): an edge that failed without a
    recorded diagnosis is diagnosed by a plain run first, so no miss goes unexplained."""
    if last is not None and last.verdict != "pass" and not diagnosed:
        return (f"{edge} failed without a recorded diagnosis; run `narwhal fabric` (it "
                "diagnoses before it resamples)")
    return None


T = TypeVar("T")


def proof_window(hosts: int) -> int:
    """How many edges are sampled between two idle proofs of every engine: as many as one
    producer has (hosts - 1). A proof asks every engine, so one per edge made the proofs grow
    as edges x engines (n^3); one per window keeps them n^2 / (n - 1), while traffic found in
    a window re-samples only that window's edges, each between proofs of its own."""
    return max(1, hosts - 1)


def proof_windows(edges: Sequence[T], hosts: int) -> list[list[T]]:
    """The edges to sample, in order, cut into windows of `proof_window(hosts)`."""
    size = proof_window(hosts)
    return [list(edges[i:i + size]) for i in range(0, len(edges), size)]
