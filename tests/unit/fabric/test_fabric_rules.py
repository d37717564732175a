"""Gate D's two rules as tables: an edge's verdict from what its sample measured, and when an
earlier sample of an edge is reused instead of measured again."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from narwhal.deploy.fabric.matrix import EdgeRow
from narwhal.deploy.gates.fabric_rules import (
    Reuse,
    edge_verdict,
    meets,
    proof_windows,
    resample_refusal,
    sample_reuse,
)

REQUIRED = 2.0


@dataclass(frozen=True)
class Last:
    verdict: str
    fingerprint: str
    measured_gbps: float | None


@pytest.mark.parametrize(("measured", "route_ok", "traffic", "verdict"), [
    (9.0, True, False, "pass"),
    (2.0, True, False, "pass"),  # exactly the budget meets it
    (1.999, True, False, "fail"),
    (None, True, False, "fail"),  # no sample: nothing meets the budget
    (9.0, False, False, "fail"),  # fast, but not over the fabric: proves nothing of it
    (9.0, True, True, "void"),  # an engine was busy around the sample
    (None, False, True, "void"),  # traffic voids before anything else is judged
    (1.0, False, True, "void"),
])
def test_an_edge_passes_only_over_the_fabric_at_the_budget_with_idle_engines(
        measured: float | None, route_ok: bool, traffic: bool, verdict: str) -> None:
    assert edge_verdict(measured, REQUIRED, route_ok=route_ok, traffic=traffic) == verdict


def test_a_missing_rate_never_meets_even_a_zero_budget() -> None:
    assert not meets(None, 0.0)
    assert meets(0.0, 0.0)


PASSED = Last("pass", "sha256:link", 5.0)


@pytest.mark.parametrize(("last", "fingerprint", "required", "resampled", "decision"), [
    (PASSED, "sha256:link", REQUIRED, False, Reuse.REUSED),
    (None, "sha256:link", REQUIRED, False, Reuse.NO_SAMPLE),
    (Last("fail", "sha256:link", 5.0), "sha256:link", REQUIRED, False, Reuse.NOT_PASSED),
    (Last("void", "sha256:link", 5.0), "sha256:link", REQUIRED, False, Reuse.NOT_PASSED),
    (PASSED, "sha256:moved", REQUIRED, False, Reuse.LINK_MOVED),
    # a workload that grew re-judges the sample: one the budget of now outgrew is measured
    (PASSED, "sha256:link", 5.5, False, Reuse.BELOW_BUDGET),
    (PASSED, "sha256:link", 5.0, False, Reuse.REUSED),
    (Last("pass", "sha256:link", None), "sha256:link", REQUIRED, False, Reuse.BELOW_BUDGET),
    (PASSED, "sha256:link", REQUIRED, True, Reuse.RESAMPLE),
    # the first rule that refuses is the one named
    (Last("fail", "sha256:old", 1.0), "sha256:link", REQUIRED, True, Reuse.NOT_PASSED),
    (PASSED, "sha256:moved", 9.0, True, Reuse.LINK_MOVED),
])
def test_a_sample_is_reused_only_for_the_same_link_still_meeting_the_budget_unasked(
        last: Last | None, fingerprint: str, required: float, resampled: bool,
        decision: Reuse) -> None:
    assert sample_reuse(last, fingerprint, required, resampled) is decision


def test_the_reuse_rule_reads_the_matrix_rows_the_gate_recorded() -> None:
    row = EdgeRow("a->b", "a", "b", 0.02, 9.1, "pass", "sha256:1", "001", False,
                  "edge-a-to-b.json", None)
    assert sample_reuse(row, "sha256:1", 0.02, False) is Reuse.REUSED
    assert sample_reuse(row, "sha256:1", 0.02, True) is Reuse.RESAMPLE


@pytest.mark.parametrize(("last", "diagnosed", "refused"), [
    (None, False, False),  # never measured: measure it
    (PASSED, False, False),
    (Last("fail", "sha256:link", 1.0), True, False),  # its miss is explained: measure again
    (Last("fail", "sha256:link", 1.0), False, True),
    (Last("void", "sha256:link", None), False, True),
])
def test_an_undiagnosed_failure_is_diagnosed_before_it_is_resampled(
        last: Last | None, diagnosed: bool, refused: bool) -> None:
    said = resample_refusal("a->b", last, diagnosed)
    assert (said is not None) is refused
    if said:
        assert said == ("a->b failed without a recorded diagnosis; run `narwhal fabric` "
                        "(it diagnoses before it resamples)")


@pytest.mark.parametrize(("hosts", "edges", "sizes"), [
    (2, 2, [1, 1]),  # one edge per producer: a proof around every sample, as before
    (3, 6, [2, 2, 2]),
    (4, 12, [3, 3, 3, 3]),
    (4, 5, [3, 2]),  # edges reused or off the fabric leave a short last window
    (32, 992, [31] * 32),
    (4, 0, []),
])
def test_each_window_holds_as_many_edges_as_one_producer_has(
        hosts: int, edges: int, sizes: list[int]) -> None:
    names = [f"e{i}" for i in range(edges)]
    windows = proof_windows(names, hosts)
    assert [len(w) for w in windows] == sizes
    assert [e for w in windows for e in w] == names  # every edge once, in the fleet's order

