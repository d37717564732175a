"""Writing the profile store: refusals before measuring, --only merges, atomic 0600 files."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.core.private_file import write_private
from narwhal.core.profiles import parse_profiles
from narwhal.serve.profiler.store_io import (
    check_target,
    render_store,
    samples_lines,
    store_document,
    write_all,
)
from tests.unit.serve.test_profiles import ROW


def _row(engine_id: str, a_s: float = 0.01) -> dict[str, object]:
    row = json.loads(json.dumps(ROW))
    row["engine_id"] = engine_id
    row["prefill"]["a_s"] = a_s
    return row


def _store(path: Path, *ids: str) -> Path:
    doc = {"schema": "narwhal.profiles", "schema_version": 1, "model": "tiny",
           "profiles": [_row(i) for i in ids]}
    path.write_text(render_store(doc))
    return path


def test_an_existing_store_needs_overwrite_and_the_error_names_file_and_flag(tmp_path: Path) -> None:
    store = _store(tmp_path / "p.json", "e0", "e1")
    with pytest.raises(InputError) as err:
        check_target(store, tmp_path / "s.jsonl", model="tiny", only=(), overwrite=False)
    assert str(store) in str(err.value) and "--overwrite" in str(err.value)
    assert check_target(store, tmp_path / "s.jsonl", model="tiny", only=(), overwrite=True).existing_rows == ()


def test_only_needs_overwrite_just_for_engines_that_already_have_a_row(tmp_path: Path) -> None:
    store = _store(tmp_path / "p.json", "e0")
    with pytest.raises(InputError, match="already has rows for e0"):
        check_target(store, tmp_path / "s.jsonl", model="tiny", only=("e0",), overwrite=False)
    added = check_target(store, tmp_path / "s.jsonl", model="tiny", only=("e1",), overwrite=False)
    assert added.replaced == () and [r["engine_id"] for r in added.existing_rows] == ["e0"]


def test_only_on_a_store_of_another_model_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path / "p.json", "e0")
    with pytest.raises(InputError, match="not the fleet's model"):
        check_target(store, tmp_path / "s.jsonl", model="other", only=("e0",), overwrite=True)


def test_a_reprofiled_row_stays_in_place_and_the_others_keep_their_bytes(tmp_path: Path) -> None:
    store = _store(tmp_path / "p.json", "e0", "e1", "e2")
    before = store.read_text()
    target = check_target(store, tmp_path / "s.jsonl", model="tiny", only=("e1",), overwrite=True)
    fresh = parse_profiles({"schema": "narwhal.profiles", "schema_version": 1, "model": "tiny",
                            "profiles": [_row("e1", a_s=0.5)]}, "x").profiles[0]
    doc = store_document(target, "tiny", [fresh], ("e0", "e1", "e2"))
    after = render_store(doc)
    assert [r["engine_id"] for r in doc["profiles"]] == ["e0", "e1", "e2"]
    for eid in ("e0", "e2"):
        text = render_store({"x": [_row(eid)]}).split("[\n", 1)[1].rsplit("\n ]", 1)[0]
        assert text in before and text in after
    assert doc["profiles"][1]["prefill"]["a_s"] == 0.5


def test_samples_of_other_engines_are_kept_with_only(tmp_path: Path) -> None:
    store = _store(tmp_path / "p.json", "e0", "e1")
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"schema": "narwhal.profile-samples", "schema_version": 1, "model": "tiny"}\n'
                       '{"engine_id": "e0", "kind": "prefill", "seconds": 1}\n'
                       '{"engine_id": "e1", "kind": "prefill", "seconds": 2}\n')
    target = check_target(store, samples, model="tiny", only=("e1",), overwrite=True)
    text = samples_lines(target, "tiny", ("e1",), [{"engine_id": "e1", "kind": "prefill", "seconds": 3}])
    lines = [json.loads(line) for line in text.splitlines()]
    assert [(x.get("engine_id"), x.get("seconds")) for x in lines[1:]] == [("e0", 1), ("e1", 3)]


def test_files_are_written_0600_and_an_invalid_store_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "file.json"
    write_private(path, "hello\n")
    assert path.read_text() == "hello\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    target = check_target(tmp_path / "p.json", tmp_path / "s.jsonl", model="tiny", only=(), overwrite=False)
    bad = {"schema": "narwhal.profiles", "schema_version": 1, "model": "tiny",
           "profiles": [_row("e0", a_s=-1.0)]}
    with pytest.raises(InputError):
        write_all(target, bad, "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep"]
