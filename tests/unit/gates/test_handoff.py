"""A gate reads an earlier gate's passed artifact through the ledger, and its fingerprint moves
when that artifact does."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.core.errors import GateBlocked, LedgerError
from narwhal.deploy.gates.handoff import passed_artifact
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.gates.runner import current_fingerprints, fingerprint, run_gate
from narwhal.deploy.gates.spec import GateSpec, Reads, sequence
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.status import compute

READS = Reads("discover", "discovery.json")
ENGINES = GateSpec("engines", reads=(READS,))
DISCOVER = GateSpec("discover")
ENV = {"discover": {"hosts": "h1"}, "engines": {"engine-image": "i1"}}


def _ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "runs", "demo").ensure()


def _discover(ledger: Ledger, body: bytes) -> None:
    run_gate(DISCOVER, ledger, ENV, {}, "", {"plan": 1},
             lambda attempt: attempt.add_artifact("discovery.json", body))


def test_a_gate_cannot_read_from_a_gate_that_has_not_passed(tmp_path: Path) -> None:
    with pytest.raises(GateBlocked) as err:
        passed_artifact(_ledger(tmp_path), "engines", READS)
    assert "run `narwhal discover` first" in err.value.cause


def test_the_read_artifact_digest_is_in_the_readers_fingerprint(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    _discover(ledger, b'{"engines": 1}')
    art = passed_artifact(ledger, "engines", READS)
    assert art.json() == {"engines": 1}
    first = fingerprint(ENGINES, ledger, ENV)
    assert first == {"engine-image": "i1", "artifact:discover/discovery.json": art.sha256}
    run_gate(ENGINES, ledger, ENV, {}, "", {}, lambda attempt: None)
    assert compute(SPECS, ledger.load(),
                   current_fingerprints({"engines": ENGINES}, ledger, ENV))[2].state == "passed"
    _discover(ledger, b'{"engines": 2}')  # discovery passed again with other facts
    rows = {r.gate: r for r in compute(SPECS, ledger.load(),
                                       current_fingerprints({"engines": ENGINES}, ledger, ENV))}
    assert rows["engines"].state == "stale"
    assert "artifact:discover/discovery.json" in rows["engines"].reason


def test_an_edited_artifact_is_a_broken_record_not_an_input(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    _discover(ledger, b'{"engines": 1}')
    art = passed_artifact(ledger, "engines", READS)
    art.path.chmod(0o600)
    art.path.write_bytes(b'{"engines": 9}')
    with pytest.raises(LedgerError, match="no longer matches the sha256"):
        passed_artifact(ledger, "engines", READS)


def test_the_plan_is_recorded_before_execute_runs(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    seen: list[bool] = []

    def execute(attempt: object) -> None:
        folder = ledger.root / "discover"
        seen.append(any((d / "plan.json").exists() for d in folder.iterdir()))
        raise GateBlocked("discover", "stop here")

    with pytest.raises(GateBlocked):
        run_gate(DISCOVER, ledger, ENV, {}, "", {"targets": ["node-1"]}, execute)
    assert seen == [True]
    assert ledger.load()["gates"]["discover"]["state"] == "blocked"


def test_a_gate_may_not_read_from_a_later_gate() -> None:
    with pytest.raises(ValueError, match="does not run before it"):
        sequence(GateSpec("discover", reads=(Reads("engines", "x.json"),)), GateSpec("engines"))
    assert list(sequence(GateSpec("discover"), ENGINES)) == ["discover", "engines"]


def test_a_gate_redoing_part_of_its_work_reads_its_last_pass_through_a_failed_attempt(
        tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    _discover(ledger, b'{"engines": 1}')

    def blocked(attempt: object) -> None:
        raise GateBlocked("discover", "disk full on node-3")

    with pytest.raises(GateBlocked):
        run_gate(DISCOVER, ledger, ENV, {}, "", {"plan": 2}, blocked)
    with pytest.raises(GateBlocked):  # to every other gate, it has not passed
        passed_artifact(ledger, "engines", READS)
    art = passed_artifact(ledger, "discover", READS, through_failures=True)
    assert art.json() == {"engines": 1} and art.attempt.startswith("001-")
