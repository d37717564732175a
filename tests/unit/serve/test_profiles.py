"""The profile store document (`narwhal.profiles` v1) and the live-generation parsers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.core.profiles import Generation, load_profiles, parse_profiles
from narwhal.serve.router.scheduling.generation import (
    GenerationUnreadable,
    parse_start_time,
    parse_version,
)
from narwhal.serve.serve_cli import main
from tests.unit.serve.test_fleet_document import GOOD

ROW: dict[str, Any] = {
    "engine_id": "p0",
    "generation": {"engine_version": "0.32.0", "process_start_time_seconds": 1796046950.45},
    "prefill": {"a_s": 0.01, "b_s_per_token": 1e-5, "c_s_per_token2": 1e-9, "fit_error": 0.02,
                "loo_error": 0.03, "samples": 12, "max_prompt_tokens": 4096},
    "decode": {"base_s": 0.005, "per_token_s": 1e-7, "per_request_s": 1e-4, "fit_error": 0.02,
               "loo_error": 0.03, "samples": 20, "max_requests": 64, "max_resident_tokens": 100000},
    "measured_at": "2026-11-30T12:00:00Z",
}


def _doc(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"schema": "narwhal.profiles", "schema_version": 1, "model": "tiny",
            "profiles": list(rows or [ROW])}


def test_a_good_store_round_trips_through_its_own_document() -> None:
    store = parse_profiles(_doc(), "p.json")
    again = parse_profiles(json.loads(json.dumps(store.document())), "p.json")
    assert again == store
    row = store.row("p0")
    assert row is not None and store.row("nope") is None
    assert row.prefill.seconds(1000) == pytest.approx(0.01 + 0.01 + 0.001)
    assert row.decode.step_s(10_000, 4) == pytest.approx(0.005 + 0.001 + 0.0004)
    assert row.generation.digest().startswith("sha256:")


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    node: Any = doc
    for part in path:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value


_DELETE = object()


@pytest.mark.parametrize(("dotted", "value", "named"), [
    ("schema", "narwhal.fleet", "schema"),
    ("model", "", "model"),
    ("profiles.0.engine_id", _DELETE, "profiles[0].engine_id"),
    ("profiles.0.generation.engine_version", "", "profiles[0].generation.engine_version"),
    ("profiles.0.generation.process_start_time_seconds", "1796046950.45",
     "profiles[0].generation.process_start_time_seconds"),
    ("profiles.0.generation.process_start_time_seconds", 0,
     "profiles[0].generation.process_start_time_seconds"),
    ("profiles.0.generation.attestation_digest", "md5:abc",
     "profiles[0].generation.attestation_digest"),
    ("profiles.0.prefill.a_s", -0.1, "profiles[0].prefill.a_s"),
    ("profiles.0.prefill.c_s_per_token2", float("nan"), "profiles[0].prefill.c_s_per_token2"),
    ("profiles.0.prefill.samples", 2, "profiles[0].prefill.samples"),
    ("profiles.0.prefill.fit_error", -1, "profiles[0].prefill.fit_error"),
    ("profiles.0.decode.per_token_s", "1e-7", "profiles[0].decode.per_token_s"),
    ("profiles.0.decode.max_requests", 0, "profiles[0].decode.max_requests"),
    ("profiles.0.decode.loo_error", _DELETE, "profiles[0].decode.loo_error"),
    ("profiles.0.measured_at", "2026-11-30T12:00:00", "profiles[0].measured_at"),
    ("profiles.0.measured_at", "yesterday", "profiles[0].measured_at"),
    ("profiles.0.prefil", {}, "profiles[0].prefil"),
])
def test_each_bad_field_is_named(dotted: str, value: Any, named: str) -> None:
    doc = _doc(copy.deepcopy(ROW))
    _set(doc, dotted, value)
    with pytest.raises(InputError) as info:
        parse_profiles(doc, "p.json")
    fields = [p.field for p in info.value.problems]
    assert named in fields, fields


def test_an_unknown_key_lists_the_keys_allowed_there() -> None:
    row = copy.deepcopy(ROW)
    row["decode"]["slope"] = 1.0
    with pytest.raises(InputError) as info:
        parse_profiles(_doc(row), "p.json")
    (problem,) = info.value.problems
    assert problem.field == "profiles[0].decode.slope" and "base_s" in problem.fix


def test_a_validators_own_words_are_kept_and_the_fix_names_the_profile_docs() -> None:
    row = copy.deepcopy(ROW)
    row["generation"]["attestation_digest"] = "md5:abc"
    with pytest.raises(InputError) as info:
        parse_profiles(_doc(row), "p.json")
    (problem,) = info.value.problems
    assert problem.problem == "must be sha256: followed by 64 lowercase hex digits"
    assert "docs/profile.md" in problem.fix


def test_rows_must_be_unique_for_the_fleets_engines_and_model() -> None:
    other = copy.deepcopy(ROW)
    other["engine_id"] = "x9"
    with pytest.raises(InputError) as info:
        parse_profiles(_doc(ROW, ROW, other), "p.json", model="big", engine_ids=("p0", "d0"))
    text = str(info.value)
    assert "profiles[1].engine_id" in text and "repeats profiles[0]" in text
    assert "profiles[2].engine_id" in text and "'x9' is not an engine of this fleet" in text
    assert "model: 'tiny' is not the fleet's model 'big'" in text


def test_another_schema_version_is_refused_with_the_way_out() -> None:
    doc = _doc()
    doc["schema_version"] = 2
    with pytest.raises(InputError, match="re-run narwhal-profile"):
        parse_profiles(doc, "p.json")


def test_a_missing_store_says_to_run_the_profiler(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="run narwhal-profile"):
        load_profiles(tmp_path / "absent.json")


def test_the_router_refuses_to_start_without_its_store(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    fleet = copy.deepcopy(GOOD)
    fleet["journal"] = {"path": str(tmp_path / "j.jsonl")}
    fleet["profiles"] = {"path": "missing-profiles.json"}
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(fleet))
    assert main(["--fleet", str(path), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "missing-profiles.json" in err and "narwhal-profile" in err


def test_version_and_start_time_parsers() -> None:
    assert parse_version(b'{"version":"0.32.0"}') == "0.32.0"
    for bad in (b"[]", b"{}", b'{"version":""}', b"nope"):
        with pytest.raises(GenerationUnreadable):
            parse_version(bad)
    page = (b"# HELP process_start_time_seconds Start time\n# TYPE process_start_time_seconds gauge\n"
            b"process_start_time_seconds_other 3\nprocess_start_time_seconds 1.79604695045e+09\n")
    assert parse_start_time(page) == 1.79604695045e+09
    for bad in (b"", b"process_start_time_seconds NaNx\n", b"process_start_time_seconds -5\n"):
        with pytest.raises(GenerationUnreadable):
            parse_start_time(bad)


def test_generations_differ_by_start_time_or_version() -> None:
    g = Generation(engine_version="0.32.0", process_start_time_seconds=10.0)
    assert g == Generation(engine_version="0.32.0", process_start_time_seconds=10.0)
    assert g != g.model_copy(update={"process_start_time_seconds": 10.01})
    assert g != g.model_copy(update={"engine_version": "0.32.1"})
