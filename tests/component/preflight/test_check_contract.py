"""narwhal-check's contract gate on Gate C's captures: three emulators started on loopback by
`narwhal-engine` (native runtime) from launch records, captured, then checked as the router
host checks them. Healthy engines and pairs pass; a block size that differs between two
engines fails the pair naming the factor; an engine restarted since its capture fails by
name; a capture folder that is wrong in any way is exit 2 before any engine is called."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.engine.testing import free_port, write_tiny_llama
from tests.component.preflight.check_fleet import CheckRun, run_check
from tests.native_engine import engine, launch_record, start

pytestmark = pytest.mark.timeout(240)
ENTRYPOINT = [sys.executable, "-m", "narwhal.lab.engine", "serve"]
ARGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "64M"]


@dataclass
class Captured:
    root: Path
    captures: Path
    urls: dict[str, str]
    run_dirs: dict[str, Path]

    def fleet(self, ids: tuple[str, ...], name: str = "fleet.json") -> Path:
        path = self.root / name
        path.write_text(json.dumps({
            "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
            "engines": [{"id": i, "url": self.urls[i], "role": "both"} for i in ids],
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "journal.jsonl"}}))
        return path

    def check(self, ids: tuple[str, ...], captures: Path | None = None,
              *extra: str) -> CheckRun:
        return run_check(self.fleet(ids), "--captures", str(captures or self.captures),
                         "--only", "contract", *extra)

    def copy(self, name: str) -> Path:
        """A private copy of the capture folder, for a test that spoils one file."""
        out = self.root / name
        shutil.copytree(self.captures, out)
        return out


def _start(root: Path, name: str, model: Path, extra: list[str]) -> tuple[str, dict[str, Any]]:
    http = free_port()
    record = root / f"{name}.json"
    launch_record(record, name, entrypoint=ENTRYPOINT, model=model, served="tiny", http=http,
                  side=free_port(), attest=free_port(), vllm_args=[*ARGS, *extra],
                  environment={})
    layout = start(record, root / name)
    return f"http://127.0.0.1:{http}", layout


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    root = tmp_path_factory.mktemp("contract")
    model = write_tiny_llama(root / "tiny")
    folder = root / "captures"
    folder.mkdir()
    state = Captured(root, folder, {}, {})
    try:
        for name, extra in (("e0", []), ("e1", []), ("odd", ["--block-size", "32"]),
                            ("again", [])):
            state.run_dirs[name] = root / name
            state.urls[name], layout = _start(root, name, model, extra)
            shutil.copy(root / f"{name}.json", folder / f"launch-{name}.json")
            (folder / f"cache-layout-{name}.json").write_text(json.dumps(layout))
        yield state
    finally:
        for run_dir in state.run_dirs.values():
            engine("stop", "--run-dir", str(run_dir))


def test_captured_engines_and_their_pairs_pass_the_contract_gate(captured: Captured) -> None:
    run = captured.check(("e0", "e1"))
    assert run.code == 0, run.failures()
    contract = run.verdicts("contract")
    assert set(contract) == {"e0", "e1", "e0->e1", "e1->e0"}
    assert {v["status"] for v in contract.values()} == {"pass"}
    layout = json.loads((captured.captures / "cache-layout-e0.json").read_text())
    assert contract["e0"]["values"]["compatibility_hash"] == \
        layout["ranks"][0]["compatibility_hash"]
    assert run.document is not None and run.document["mode"] == "check --only reach,contract"
    assert set(run.verdicts("reach")) == {"e0", "e1"}  # what the contract gate needs ran too


def test_without_captures_the_gate_is_skipped_with_the_reason_never_passed(
        captured: Captured) -> None:
    run = run_check(captured.fleet(("e0", "e1")), "--only", "contract")
    assert run.code == 0
    [(subject, verdict)] = run.verdicts("contract").items()
    assert subject == "fleet" and verdict["status"] == "skip"
    assert "--captures" in verdict["detail"]


def test_a_larger_producer_block_fails_the_pair_naming_the_factor(captured: Captured) -> None:
    run = captured.check(("e0", "odd"))
    assert run.code == 1
    contract = run.verdicts("contract")
    assert contract["e0"]["status"] == contract["odd"]["status"] == "pass"  # each as planned
    # odd's 32-token blocks cannot land in e0's 16-token ones; the other way round, each
    # of odd's blocks takes two of e0's (core/kv's block rule, as vLLM applies it)
    assert contract["odd->e0"]["status"] == "fail", contract["odd->e0"]
    assert "odd -> e0: block_size" in contract["odd->e0"]["detail"]
    assert contract["e0->odd"]["status"] == "pass", contract["e0->odd"]


def test_a_launch_record_edited_after_the_capture_fails_the_engine(captured: Captured) -> None:
    folder = captured.copy("edited")
    path = folder / "launch-e1.json"
    record = json.loads(path.read_text())
    record["vllm_args"] += ["--block-size", "64"]
    path.write_text(json.dumps(record))
    run = captured.check(("e0", "e1"), folder)
    assert run.code == 1
    detail = run.verdicts("contract")["e1"]["detail"]
    assert "taken from launch record" in detail  # the capture is of another plan
    assert "block_size: predicted 64" in detail  # and the live layout is not this plan's


def test_an_engine_restarted_since_its_capture_fails_by_name(captured: Captured) -> None:
    run_dir = str(captured.run_dirs["again"])
    assert engine("stop", "--run-dir", run_dir).ok
    assert engine("check", "--run-dir", run_dir).ok
    assert engine("start", "--run-dir", run_dir).ok
    assert engine("capture", "--run-dir", run_dir, "--timeout", "60", timeout=160).ok
    run = captured.check(("e0", "again"))  # the folder still holds the first capture
    assert run.code == 1
    verdict = run.verdicts("contract")["again"]
    assert verdict["status"] == "fail"
    assert "restarted since Gate C captured it" in verdict["detail"]
    assert "narwhal engines" in verdict["detail"]
    assert run.verdicts("contract")["e0"]["status"] == "pass"


@pytest.mark.parametrize(("case", "file", "content", "said"), [
    ("missing", None, None, "has no cache-layout-e1.json"),
    ("not-json", "cache-layout-e1.json", b"{\"schema\": ", "not JSON"),
    ("huge", "cache-layout-e1.json", b" " * (5 << 20), "larger than"),
    ("not-utf8", "launch-e1.json", b"\xff\xfe{}", "not UTF-8"),
    ("smuggled-key", "cache-layout-e1.json", None, "unknown key"),
    ("other-engine", "cache-layout-e1.json", None, "describe"),
])
def test_a_bad_capture_folder_is_exit_2_before_any_engine_is_called(
        captured: Captured, case: str, file: str | None, content: bytes | None,
        said: str) -> None:
    folder = captured.copy(f"bad-{case}")
    layout = json.loads((folder / "cache-layout-e1.json").read_text())
    if case == "missing":
        (folder / "cache-layout-e1.json").unlink()
    elif case == "smuggled-key":
        layout["ranks"][0]["metadata"]["kv_cache_layout\u0000"] = "HND"
        (folder / "cache-layout-e1.json").write_text(json.dumps(layout))
    elif case == "other-engine":
        shutil.copy(folder / "cache-layout-e0.json", folder / "cache-layout-e1.json")
    else:
        assert file is not None and content is not None
        (folder / file).write_bytes(content)
    run = run_check(captured.fleet(("e0", "e1")), "--captures", str(folder), "--only",
                    "contract", json_out=False)
    assert run.code == 2, run.stderr
    assert said in run.stderr and "e1" in run.stderr
    assert "contract gate..." not in run.stderr and "reach gate..." not in run.stderr


def test_captures_that_is_not_a_folder_and_an_unknown_gate_are_refused(
        captured: Captured, tmp_path: Path) -> None:
    fleet = captured.fleet(("e0",))
    run = run_check(fleet, "--captures", str(tmp_path / "nope"), json_out=False)
    assert run.code == 2 and "is not a folder" in run.stderr
    run = run_check(fleet, "--only", "contract,everything", json_out=False)
    assert run.code == 2 and "everything is not a gate" in run.stderr
