"""Bad flags and bad documents stop narwhal-check with exit 2, naming the field, before it
calls any engine (the fleet here points at a listener that records every connection)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.component.preflight.check_fleet import run_check

pytestmark = pytest.mark.timeout(60)


class Listener:
    """A TCP listener standing in for an engine: it only counts who connects."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        for _ in range(100_000):  # bounded: about 5.5 hours at 0.2 s per empty wait
            if self._stop.is_set():
                return
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lis = Listener()
    try:
        yield lis
    finally:
        lis.close()


def fleet_doc(port: int, **sections: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
        "engines": [{"id": "e0", "url": f"http://127.0.0.1:{port}", "role": "both"}],
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "journal.jsonl"},
        "profiles": {"path": "profiles.json"}}
    doc.update(sections)
    return doc


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc))
    return path


def assert_refused(run_code: int, listener: Listener, tmp_path: Path) -> None:
    assert run_code == 2
    assert listener.connections == 0, "an engine was called despite bad input"
    assert not list(tmp_path.glob("preflight-*.json")), "evidence written for a refused run"


@pytest.mark.parametrize(("flags", "named"), [
    (["--pace-factor", "nan"], "--pace-factor"),
    (["--pace-factor", "0.5"], "--pace-factor"),
    (["--kv-tokens", "4"], "--kv-tokens"),
    (["--reach-timeout", "soon"], "--reach-timeout"),
    (["--max-fit-error", "-1"], "--max-fit-error"),
    (["--no-such-flag"], "--no-such-flag"),
])
def test_a_bad_flag_is_exit_2_naming_it_and_nothing_is_measured(
        flags: list[str], named: str, listener: Listener, tmp_path: Path) -> None:
    run = run_check(write(tmp_path, fleet_doc(listener.port)), *flags, json_out=False)
    assert_refused(run.code, listener, tmp_path)
    assert named in run.stderr


@pytest.mark.parametrize(("sections", "named"), [
    ({"servng": {}}, "servng"),
    ({"serving": {"first_token_timeout_s": -1}}, "serving.first_token_timeout_s"),
    ({"calibration": {"path": ""}}, "calibration.path"),
    ({"calibration": {"path": "cal.json", "deadline": 3}}, "calibration.deadline"),
    ({"engines": []}, "engines"),
])
def test_a_bad_fleet_document_is_exit_2_naming_the_field(
        sections: dict[str, Any], named: str, listener: Listener, tmp_path: Path) -> None:
    run = run_check(write(tmp_path, fleet_doc(listener.port, **sections)), json_out=False)
    assert_refused(run.code, listener, tmp_path)
    assert named in run.stderr
    assert run.stdout.startswith("NARWHAL_RESULT ") and '"ok":false' in run.stdout


def test_a_missing_calibration_document_is_exit_2_naming_the_file(
        listener: Listener, tmp_path: Path) -> None:
    fleet = write(tmp_path, fleet_doc(listener.port, calibration={"path": "nowhere.json"}))
    run = run_check(fleet, json_out=False)
    assert_refused(run.code, listener, tmp_path)
    assert "nowhere.json" in run.stderr and "--calibrate-first-token" in run.stderr


def test_an_existing_evidence_file_is_never_overwritten(listener: Listener, tmp_path: Path) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("earlier evidence")
    run = run_check(write(tmp_path, fleet_doc(listener.port)), "--evidence", str(kept),
                    json_out=False)
    assert_refused(run.code, listener, tmp_path)
    assert kept.read_text() == "earlier evidence" and "written once" in run.stderr


def test_calibration_out_without_calibrating_is_refused(listener: Listener, tmp_path: Path) -> None:
    run = run_check(write(tmp_path, fleet_doc(listener.port)), "--calibration-out",
                    str(tmp_path / "c.json"), json_out=False)
    assert_refused(run.code, listener, tmp_path)
    assert "--calibrate-first-token" in run.stderr


def test_an_unreachable_engine_fails_reach_and_every_later_gate_skips_it(tmp_path: Path) -> None:
    """A port nobody listens on: reach fails by name (exit 1), nothing else is attempted."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = run_check(write(tmp_path, fleet_doc(port)), "--reach-timeout", "2")
    assert run.code == 1
    assert run.verdicts("reach", "fail")["e0"]["detail"].startswith("e0: GET /health")
    assert run.verdicts("model")["e0"]["status"] == "skip"
    assert run.verdicts("pace")["e0"]["status"] == "skip"


@pytest.mark.parametrize("calibrating", [False, True])
def test_a_canary_out_that_cannot_be_written_or_means_nothing_is_refused(
        listener: Listener, tmp_path: Path, calibrating: bool) -> None:
    where = tmp_path / ("missing-folder/kv.json" if calibrating else "kv.json")
    run = run_check(write(tmp_path, fleet_doc(listener.port)),
                    *(["--calibrate-first-token"] if calibrating else []),
                    "--canary-out", str(where), json_out=False)
    assert_refused(run.code, listener, tmp_path)
    assert "--canary-out" in run.stderr
    assert ("does not exist" if calibrating else "--calibrate-first-token") in run.stderr
