"""What `narwhal status` makes of a router that does not answer and of links that moved: the
gates they make stale and the work the runbook's rows name."""

from __future__ import annotations

from narwhal.core.gates import GATES
from narwhal.deploy.gates.live_check import (
    PROMETHEUS_REPEAT,
    ROUTER_REPEAT,
    LinkChange,
    Live,
    prometheus_reason,
)
from narwhal.deploy.ledger.status import GateStatus
from tests.unit.gates.live_findings import with_live_changes


def _rows() -> list[GateStatus]:
    return [GateStatus(g.name, g.letter, "passed", 1, "001", "", ()) for g in GATES]


DOC = {"gates": {g.name: {"state": "passed"} for g in GATES}}


def test_a_router_that_does_not_answer_makes_only_gate_g_stale() -> None:
    rows = {r.gate: r for r in with_live_changes(_rows(), DOC, [], router="pid 7 is gone")}
    assert {g for g, r in rows.items() if r.state != "passed"} == {"serve"}
    assert rows["serve"].reason == "router not serving: pid 7 is gone"
    assert rows["serve"].repeat == ("serve",)
    assert "live generation" in ROUTER_REPEAT[0] and "narwhal serve" in ROUTER_REPEAT[0]


def test_a_moved_link_makes_the_fabric_and_the_preflight_stale_and_keeps_the_engines() -> None:
    moved = [LinkChange("node-1->node-3", ("destination_interface",)),
             LinkChange("node-3->node-1", ("source_interface", "route"))]
    rows = {r.gate: r for r in with_live_changes(_rows(), DOC, [], links=moved)}
    assert rows["engines"].state == rows["discover"].state == "passed"
    assert rows["fabric"].state == "stale"
    assert rows["fabric"].reason == ("link moved since measured: node-1->node-3 "
                                     "(destination_interface); node-3->node-1 "
                                     "(source_interface, route)")
    assert rows["preflight"].state == "stale"
    assert rows["fabric"].repeat == ("fabric", "attest", "preflight", "serve")
    assert moved[0].repeat[0].startswith("fabric: sample node-1->node-3 again")
    assert moved[0].repeat[1].startswith("full preflight")


def test_nothing_moved_changes_no_row_and_says_so_in_json() -> None:
    assert with_live_changes(_rows(), DOC, [], router="", links=[]) == _rows()
    live = Live()
    assert not (live.engines or live.router or live.links or live.prometheus)
    assert live.as_dict() == {"engines_changed": [], "links_moved": [],
                              "router": {"down": False, "reason": "", "repeat": []},
                              "prometheus": {"down": False, "reason": "", "repeat": []},
                              "kv_pairs_held": []}


def test_a_prometheus_that_is_gone_makes_only_gate_g_stale_naming_it_and_the_fix() -> None:
    why = prometheus_reason("http://127.0.0.1:9090", "router", 41, running=False, answers=False)
    rows = {r.gate: r for r in with_live_changes(_rows(), DOC, [], prometheus=why)}
    assert {g for g, r in rows.items() if r.state != "passed"} == {"serve"}
    assert rows["serve"].state == "stale" and rows["serve"].repeat == ("serve",)
    reason = rows["serve"].reason
    assert reason.startswith("prometheus not serving: Prometheus at http://127.0.0.1:9090 on "
                             "router is gone (pid 41")
    assert "`narwhal serve`" in reason and "`narwhal deploy`" in reason
    both = {r.gate: r for r in with_live_changes(_rows(), DOC, [], router="pid 7 is gone",
                                                 prometheus=why)}
    assert both["serve"].reason.startswith("router not serving: pid 7 is gone; prometheus not "
                                           "serving: ")


def test_prometheus_is_serving_only_while_its_process_runs_and_answers() -> None:
    at = ("http://127.0.0.1:9090", "router", 41)
    assert prometheus_reason(*at, running=True, answers=True) == ""
    assert prometheus_reason(*at, running=None, answers=True) == ""  # no process recorded
    assert "does not answer" in prometheus_reason(*at, running=True, answers=False)
    assert "pid 41 still runs" in prometheus_reason(*at, running=True, answers=False)
    assert "does not answer" in prometheus_reason(*at, running=None, answers=False)
    gone = prometheus_reason(*at, running=False, answers=True)  # something else answers there
    assert "is gone (pid 41" in gone and "something else answers" in gone
    live = Live(prometheus=gone)
    assert live.as_dict()["prometheus"] == {"down": True, "reason": gone,
                                            "repeat": list(PROMETHEUS_REPEAT)}
    assert "narwhal serve" in PROMETHEUS_REPEAT[0] and "narwhal deploy" in PROMETHEUS_REPEAT[0]


def test_the_held_kv_pairs_are_the_primary_s_with_their_evidence() -> None:
    from narwhal.deploy.gates.live_check import held_kv_pairs
    pairs = {"e0->e1": {"held": True, "verdict": "mismatch", "evidence": "answered ' x'",
                        "held_since": 5.0},
             "e1->e0": {"held": False, "verdict": "ok", "evidence": "fine"}, "junk": "x"}
    primary = (200, {"controller": {"role": "primary"}, "kv_canary": {"pairs": pairs}})
    standby = (200, {"controller": {"role": "standby"}, "kv_canary": {"pairs": {
        "e2->e3": {"held": True}}}})
    assert held_kv_pairs({"a": standby, "b": primary}) == [
        {"pair": "e0->e1", "verdict": "mismatch", "evidence": "answered ' x'",
         "held_since": 5.0}]
    assert held_kv_pairs({"a": standby, "b": None}) == []  # no primary answers: none said
    assert held_kv_pairs({"b": (200, {"controller": {"role": "primary"},
                                      "kv_canary": None})}) == []  # no canary
    assert held_kv_pairs({}) == []
