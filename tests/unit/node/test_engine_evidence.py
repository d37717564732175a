"""What `narwhal-engine` keeps for Gate C's record beyond the capture: the raw HTTP exchanges
(never a credential) and the engine log's tail (bounded, from a line start, its full length
said), as the workstation will read them."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from narwhal.core import result_line
from narwhal.node.engine import http_capture
from narwhal.node.engine.runtime import log_tail
from narwhal.node.engine_cli import main

KEY = "sk-engine-key-4411"


def test_an_authorization_header_is_named_and_its_value_never_kept() -> None:
    got = http_capture.headers([("authorization", f"Bearer {KEY}"),
                                ("Content-Type", "application/json"), ("Cookie", "s=1")])
    assert got == {"headers": {"Content-Type": "application/json"},
                   "not_kept": ["Cookie", "authorization"]}


def test_a_body_is_kept_as_received_with_its_full_length_and_digest() -> None:
    text = http_capture.body(b'{"text":"fox"}')
    assert text == {"bytes": 14, "sha256": hashlib.sha256(b'{"text":"fox"}').hexdigest(),
                    "truncated": False, "text": '{"text":"fox"}'}
    raw = bytes(range(256))
    binary = http_capture.body(raw)
    assert binary is not None and base64.b64decode(binary["base64"]) == raw
    cut = http_capture.body(b"x" * 10, limit=4)
    assert cut is not None and cut["text"] == "xxxx" and cut["truncated"] and cut["bytes"] == 10
    assert cut["sha256"] == hashlib.sha256(b"x" * 10).hexdigest()  # of all that came
    assert http_capture.body(None) is None


def test_the_exchanges_file_holds_status_and_bodies_and_no_key() -> None:
    kept = http_capture.Exchanges()
    kept.add("completion", ("POST", "http://127.0.0.1:8000/v1/completions",
                            [("Authorization", f"Bearer {KEY}")], b'{"prompt":"fox"}'),
             (200, [("content-type", "application/json")], b'{"choices":[{"text":" jumps"}]}'),
             0.0)
    kept.add("version", ("GET", "http://127.0.0.1:8000/version", [], None),
             (0, [], None), 0.0, "connection refused")
    data = kept.document("engine-1")
    doc = json.loads(data)
    assert doc["schema"] == http_capture.SCHEMA and doc["engine"] == "engine-1"
    done, refused = doc["exchanges"]
    assert done["response"]["status"] == 200
    assert done["response"]["body"]["text"] == '{"choices":[{"text":" jumps"}]}'
    assert done["request"]["body"]["text"] == '{"prompt":"fox"}'
    assert done["request"]["not_kept"] == ["Authorization"]
    assert refused["response"] == {"status": 0, "headers": {}, "not_kept": [], "body": None}
    assert refused["error"] == "connection refused"
    assert KEY.encode() not in data


def test_a_log_under_the_bound_is_kept_whole(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"INFO Starting vLLM API server 0 on http://127.0.0.1:8000\n")
    assert log_tail(None, log, 1 << 20) == (log.read_bytes(), log.stat().st_size)
    assert log_tail(None, tmp_path / "absent.log", 10) == (b"", 0)


def test_a_long_log_keeps_its_last_bytes_from_a_line_start(tmp_path: Path) -> None:
    lines = [f"line {i:06d} {'x' * 50}\n".encode() for i in range(20_000)]
    log = tmp_path / "engine.log"
    log.write_bytes(b"".join(lines))
    kept, total = log_tail(None, log, 100_000)
    assert total == log.stat().st_size and len(kept) <= 100_000
    assert kept.endswith(lines[-1]) and kept.startswith(b"line ")  # no partial first line
    assert log.read_bytes().endswith(kept)


def test_evidence_writes_the_log_tail_and_names_it_with_its_digest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Also before any start: a native engine's log is the file in its run dir."""
    (tmp_path / "engine.log").write_bytes(b"a\nb\nc\n")
    assert main(["evidence", "--run-dir", str(tmp_path), "--log-bytes", "3"]) == 0
    got = result_line.parse(capsys.readouterr().out, "narwhal-engine evidence")
    tail = (tmp_path / "engine-log-tail.txt").read_bytes()
    assert tail == b"c\n"  # the last 3 bytes, "\nc\n", less the partial line before "c"
    assert got.data["log"] == {"path": str(tmp_path / "engine-log-tail.txt"), "bytes": 2,
                               "sha256": hashlib.sha256(tail).hexdigest(),
                               "source": str(tmp_path / "engine.log"), "total_bytes": 6,
                               "limit_bytes": 3}
    assert got.data["http"] is None  # no capture ran here


def test_evidence_refuses_an_unbounded_log_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["evidence", "--run-dir", str(tmp_path), "--log-bytes", "0"])
    assert not (tmp_path / "engine-log-tail.txt").exists()
