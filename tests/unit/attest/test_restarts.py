"""What `narwhal status` makes of each sidecar's answer: the reason, and exactly what to repeat."""

from __future__ import annotations

from narwhal.core.result_line import ResultLine
from narwhal.deploy.gates.restarts import EngineChange, _repeat, judge
from narwhal.deploy.ledger.status import GateStatus
from tests.unit.gates.live_findings import with_live_changes

DIGEST = "sha256:" + "a" * 64
ENGINE = {"id": "engine-2", "contract": {"attestation_digest": DIGEST}}


def _got(status: int, document: dict[str, object], ok: bool = True,
         error: str = "") -> ResultLine:
    return ResultLine(command="narwhal-attest fetch", ok=ok,
                      data={"status": status, "document": document}, error=error)


def test_a_sidecar_that_vouches_for_the_contract_needs_nothing() -> None:
    assert judge(ENGINE, _got(200, {"digest": DIGEST})) == ("", False)


def test_a_restarted_engine_is_a_process_change_and_the_sidecars_words_are_the_reason() -> None:
    why, changed = judge(ENGINE, _got(503, {"kind": "process_changed",
                                            "error": "engine process changed: it started at 2"}))
    assert changed and why.startswith("engine process changed")
    why, changed = judge(ENGINE, _got(503, {"kind": "layout_changed",
                                            "error": "layout changed: cache_config_info"}))
    assert changed and why.startswith("layout changed")


def test_other_refusals_are_not_taken_for_an_engine_change() -> None:
    assert judge(ENGINE, _got(503, {"kind": "unreadable",
                                    "error": "engine not answering (timed out)"}))[1] is False
    why, changed = judge(ENGINE, _got(200, {"digest": "sha256:" + "b" * 64}))
    assert not changed and "is not the fleet's contract" in why
    why, changed = judge(ENGINE, _got(0, {}, ok=False, error="connection refused"))
    assert not changed and "cannot be read" in why
    assert judge(ENGINE, _got(404, {}))[0] == "the sidecar answered 404"


def test_an_engine_change_repeats_capture_attestation_profile_and_preflight_fabric_if_moved(
        ) -> None:
    steps = _repeat("engine-2", process_changed=True, recaptured=False)
    assert [s.split(":")[0] for s in steps] == ["capture", "attestation", "profile of engine-2",
                                                "full preflight", "fabric"]
    assert "--recapture engine-2" in steps[0] and "only when" in steps[-1]
    assert not _repeat("engine-2", process_changed=True, recaptured=True)[0].startswith("capture")
    assert _repeat("engine-2", process_changed=False, recaptured=False) == (
        "attestation: `narwhal attest` (replaces the sidecar of engine-2 only)",)


def _rows() -> list[GateStatus]:
    return [GateStatus(g, letter, "passed", 1, "001", "", ())
            for letter, g in zip("ABCDE", ("discover", "install", "engines", "fabric",
                                          "attest"), strict=True)]


def test_a_live_change_makes_capture_and_attestation_stale_and_keeps_the_fabric() -> None:
    doc = {"gates": {r.gate: {"state": "passed"} for r in _rows()}}
    change = EngineChange("engine-2", "engine process changed", (), recapture=True)
    rows = {r.gate: r for r in with_live_changes(_rows(), doc, [change])}
    assert rows["discover"].state == rows["install"].state == "passed"
    assert rows["engines"].state == "stale" and "engine-2" in rows["engines"].reason
    assert rows["attest"].state == "stale" and "engine process changed" in rows["attest"].reason
    assert rows["fabric"].state == "passed"  # the geometry is not known to have moved
    assert rows["engines"].repeat[0] == "engines"


def test_a_sidecar_change_alone_leaves_gate_c_passed() -> None:
    doc = {"gates": {r.gate: {"state": "passed"} for r in _rows()}}
    change = EngineChange("engine-2", "the sidecar cannot be read", (), recapture=False)
    rows = {r.gate: r for r in with_live_changes(_rows(), doc, [change])}
    assert rows["engines"].state == "passed" and rows["attest"].state == "stale"
    assert with_live_changes(_rows(), doc, []) == _rows()


def test_an_engine_that_is_not_running_is_started_again_then_attested_and_profiled() -> None:
    steps = _repeat("engine-3", process_changed=True, recaptured=False, restart=True)
    assert [s.split(":")[0] for s in steps] == ["start and capture", "attestation",
                                                "profile of engine-3", "full preflight",
                                                "fabric"]
    assert "--restart engine-3" in steps[0]
    doc = {"gates": {r.gate: {"state": "passed"} for r in _rows()}}
    change = EngineChange("engine-3", "engine process changed: gone; its host says it is not "
                          "running", steps, recapture=True, restart=True)
    rows = {r.gate: r for r in with_live_changes(_rows(), doc, [change])}
    assert rows["engines"].state == "stale"
    assert rows["engines"].reason == "not running, to start again: engine-3"
    assert rows["fabric"].state == "passed" and rows["attest"].state == "stale"
