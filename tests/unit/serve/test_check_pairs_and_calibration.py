"""Which pairs the kv gate measures, how the calibration rule derives its candidate, and the
strict calibration document and fleet section."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.calibration import load_calibration, parse_calibration
from narwhal.core.errors import InputError
from narwhal.core.fleet import EngineEntry, parse_fleet
from narwhal.serve.preflight.calibrate import lengths_for, p95
from narwhal.serve.preflight.kv_gate import DECODE_TOKENS
from narwhal.serve.preflight.options import CalibrateOptions
from narwhal.serve.preflight.pairs import all_pairs, host_of, ring_pairs, rounds
from narwhal.serve.preflight.report import evidence_path
from narwhal.serve.router.calibrated_deadline import check_fleet_deadline, deadline_problem


def engines(*roles: str) -> tuple[EngineEntry, ...]:
    return tuple(EngineEntry(id=f"e{i}", url=f"http://127.0.0.1:{8000 + i}", role=r)  # type: ignore[arg-type]
                 for i, r in enumerate(roles))


def test_every_ordered_pair_of_both_engines_is_checked_except_an_engine_with_itself() -> None:
    pairs = all_pairs(engines("both", "both", "both", "both"))
    assert len(pairs) == 12 and len(set(pairs)) == 12
    assert all(p != c for p, c in pairs)


def test_fixed_roles_pair_only_producers_with_consumers() -> None:
    assert all_pairs(engines("prefill", "decode", "both")) == [
        ("e0", "e1"), ("e0", "e2"), ("e2", "e1")]


def test_a_ring_makes_every_engine_produce_and_consume_with_n_pairs() -> None:
    ring = ring_pairs(engines("both", "both", "both", "both"))
    assert ring == [("e0", "e1"), ("e1", "e2"), ("e2", "e3"), ("e3", "e0")]


def test_a_ring_over_fixed_roles_still_uses_every_engine() -> None:
    ring = ring_pairs(engines("prefill", "prefill", "decode"))
    assert {p for p, _ in ring} == {"e0", "e1"} and {c for _, c in ring} == {"e2"}


def test_p95_is_the_nearest_rank_so_a_few_samples_give_their_largest() -> None:
    assert p95([0.3, 0.1, 0.2]) == 0.3
    assert p95([float(i) for i in range(1, 101)]) == 95.0


CAL: dict[str, Any] = {
    "schema": "narwhal.first-token-calibration", "schema_version": 1, "model": "tiny",
    "candidate_s": 0.8, "rule": "worst p95 x 2, rounded up to 0.1 s", "safety_factor": 2.0,
    "pairs": [{"producer": "a", "consumer": "b",
               "lengths": [{"prompt_tokens": 64, "samples_s": [0.2, 0.3], "p95_s": 0.3}]}],
    "generations": [{"engine_id": "a", "generation": {"engine_version": "0.32.0",
                                                      "process_start_time_seconds": 1.0}}],
    "measured_at": "2026-11-30T12:00:00+00:00",
}


@pytest.mark.parametrize(("change", "field"), [
    ({"candidate_s": 0}, "candidate_s"),
    ({"candidate_s": "0.8"}, "candidate_s"),
    ({"rule": ""}, "rule"),
    ({"pairs": []}, "pairs"),
    ({"deadline_s": 3}, "deadline_s"),
    ({"measured_at": "2026-11-30T12:00:00"}, "measured_at"),
])
def test_a_bad_calibration_document_names_the_field(change: dict[str, Any], field: str) -> None:
    doc = {**copy.deepcopy(CAL), **change}
    with pytest.raises(InputError) as info:
        parse_calibration(doc, "cal.json")
    assert any(p.field == field for p in info.value.problems), info.value


def test_a_calibration_of_another_version_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({**CAL, "schema_version": 2}))
    with pytest.raises(InputError) as info:
        load_calibration(path)
    assert "schema_version" in str(info.value)


def test_a_deadline_below_the_candidate_names_deadline_candidate_and_file() -> None:
    cal = parse_calibration(copy.deepcopy(CAL), "cal.json")
    problem = deadline_problem(0.5, cal, Path("/runs/cal.json"), "tiny")
    assert problem is not None and problem.field == "serving.first_token_timeout_s"
    assert "0.5 s is below the calibrated candidate 0.8 s in /runs/cal.json" in problem.problem
    assert deadline_problem(0.8, cal, Path("/runs/cal.json"), "tiny") is None


FLEET: dict[str, Any] = {
    "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
    "engines": [{"id": "a", "url": "http://10.0.0.5:8000", "role": "both"}],
    "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "j.jsonl"},
}


@pytest.mark.parametrize(("section", "field"), [
    ({"path": ""}, "calibration.path"),
    ({"path": "c.json", "candidate_s": 1}, "calibration.candidate_s"),
    ({}, "calibration.path"),
    ("c.json", "calibration"),
])
def test_the_fleet_calibration_section_is_strict(section: Any, field: str) -> None:
    with pytest.raises(InputError) as info:
        parse_fleet({**FLEET, "calibration": section}, "fleet.json")
    assert any(p.field == field for p in info.value.problems), info.value


def test_the_router_check_reads_the_calibration_beside_the_fleet(tmp_path: Path) -> None:
    (tmp_path / "cal.json").write_text(json.dumps(CAL))
    fleet_path = tmp_path / "fleet.json"
    ok = parse_fleet({**FLEET, "calibration": {"path": "cal.json"},
                      "serving": {"first_token_timeout_s": 1.0}}, "fleet.json")
    assert check_fleet_deadline(ok, fleet_path) is not None
    low = parse_fleet({**FLEET, "calibration": {"path": "cal.json"},
                       "serving": {"first_token_timeout_s": 0.2}}, "fleet.json")
    with pytest.raises(InputError) as info:
        check_fleet_deadline(low, fleet_path)
    assert str(tmp_path / "cal.json") in str(info.value)
    assert check_fleet_deadline(parse_fleet(FLEET, "fleet.json"), fleet_path) is None


def test_evidence_names_never_reuse_an_existing_file(tmp_path: Path) -> None:
    from datetime import UTC, datetime
    now = datetime(2026, 11, 30, 15, 0, 0, tzinfo=UTC)
    fleet = tmp_path / "fleet.json"
    first = evidence_path(fleet, now)
    assert first.name == "preflight-20261130T150000Z.json"
    first.write_text("{}")
    assert evidence_path(fleet, now).name == "preflight-20261130T150000Z-2.json"


def test_calibration_prompts_leave_room_for_the_consumers_tokens_in_the_context() -> None:
    """A profile may reach the context's last token (max model length 512: prompts to 511);
    a handoff of that prompt plus the consumer's own tokens would be refused with a 400."""
    from types import SimpleNamespace

    def rows(*longest: int) -> Any:
        return SimpleNamespace(store=SimpleNamespace(profiles=[
            SimpleNamespace(prefill=SimpleNamespace(max_prompt_tokens=n)) for n in longest]))

    lengths = lengths_for(rows(511, 4095), CalibrateOptions())
    assert len(lengths) == 3 and lengths[-1] + DECODE_TOKENS <= 512 - 4
    big = lengths_for(rows(4095, 4095), CalibrateOptions())
    assert big[-1] <= 1024 and big[-1] >= 1000  # capped by --calibrate-max-tokens, barely less


def _on_hosts(count: int) -> tuple[EngineEntry, ...]:
    return tuple(EngineEntry(id=f"e{i}", url=f"http://10.214.0.{10 + i}:8000", role="both")
                 for i in range(count))


@pytest.mark.parametrize(("hosts", "wanted_rounds"), [(2, 2), (3, 6), (4, 6), (8, 14),
                                                      (32, 62)])
def test_pairs_run_in_rounds_in_which_no_host_is_in_two_pairs(hosts: int,
                                                               wanted_rounds: int) -> None:
    fleet = _on_hosts(hosts)
    pairs = all_pairs(fleet)
    where = host_of(fleet)
    batches = rounds(pairs, where)
    assert sorted(p for b in batches for p in b) == sorted(pairs)  # every pair exactly once
    for batch in batches:
        ends = [where[e] for pair in batch for e in pair]
        assert len(ends) == len(set(ends)), batch  # no host twice: no shared queue or NIC
    assert len(batches) == wanted_rounds  # 2(n-1) for n >= 4: not n(n-1) turns


def test_engines_that_share_a_host_are_checked_one_pair_at_a_time() -> None:
    fleet = engines("both", "both", "both")  # every URL is 127.0.0.1
    assert [len(b) for b in rounds(all_pairs(fleet), host_of(fleet))] == [1] * 6
    two_gpus = (*_on_hosts(2), EngineEntry(id="e9", url="http://10.214.0.10:8001", role="both"))
    where = host_of(two_gpus)
    assert where["e9"] == where["e0"] == "10.214.0.10"
    for batch in rounds(all_pairs(two_gpus), where):
        assert len(batch) == 1  # three engines on two hosts: any two pairs share a host
