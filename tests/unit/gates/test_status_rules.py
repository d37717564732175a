"""The repeat-work table computed: which gates a moved input makes stale, and which follow."""

from __future__ import annotations

from typing import Any

from narwhal.core.gates import GATE_NAMES
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.ledger.status import Judged, compute


def _all_passed() -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    prints = {g: {name: f"{name}-1" for name in SPECS[g].inputs} for g in GATE_NAMES}
    doc = {"gates": {g: {"state": "passed", "fingerprint": dict(prints[g]), "attempts": ["a1"]}
                     for g in GATE_NAMES}}
    return doc, prints


def _stale(rows: list[Any]) -> dict[str, tuple[str, ...]]:
    return {r.gate: r.repeat for r in rows if r.state == "stale"}


def test_a_moved_workload_makes_the_fabric_stale_alone() -> None:
    doc, now = _all_passed()
    now["fabric"]["workload"] = "workload-2"
    rows = compute(SPECS, doc, now)
    assert _stale(rows) == {"fabric": ("fabric",)}
    assert {r.gate: r.reason for r in rows}["fabric"] == "input moved: workload"


def test_a_moved_route_makes_the_fabric_and_every_later_gate_stale() -> None:
    doc, now = _all_passed()
    now["fabric"]["fabric"] = "fabric-2"
    now["fabric"]["workload"] = "workload-2"  # with it: not only a re-judgement
    stale = _stale(compute(SPECS, doc, now))
    assert list(stale) == ["fabric", "attest", "preflight", "serve"]
    assert stale["fabric"] == ("fabric", "attest", "preflight", "serve")
    assert all(r.startswith("upstream") for r in
               [row.reason for row in compute(SPECS, doc, now) if row.gate == "serve"])


def test_a_measured_input_that_no_longer_holds_makes_its_gate_and_the_later_ones_stale() -> None:
    doc, now = _all_passed()
    rows = compute(SPECS, doc, now, Judged(measured={"preflight": "beyond the profiled range: engine-2"}))
    assert _stale(rows) == {"preflight": ("preflight", "serve"), "serve": ("serve",)}
    assert {r.gate: r.reason for r in rows}["preflight"] == "beyond the profiled range: engine-2"


def test_a_measured_input_is_not_judged_for_a_gate_that_has_not_passed() -> None:
    doc, now = _all_passed()
    doc["gates"]["preflight"]["state"] = "blocked"
    rows = compute(SPECS, doc, now, Judged(measured={"preflight": "beyond the profiled range"}))
    assert {r.gate: r.state for r in rows}["preflight"] == "blocked"
    assert _stale(rows) == {}
