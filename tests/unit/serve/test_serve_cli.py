"""`narwhal-serve` refuses bad flags and bad fleet documents before it listens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.serve.serve_cli import main
from tests.unit.serve.test_fleet_document import GOOD


def _result(out: str) -> dict[str, object]:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("NARWHAL_RESULT ")]
    return dict(json.loads(line[len("NARWHAL_RESULT "):]))


def test_fleet_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "--fleet" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["0", "65536", "http", "-1"])
def test_a_port_outside_1_to_65535_is_a_usage_error(port: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--fleet", str(tmp_path / "f.json"), "--port", port])
    assert info.value.code == 2
    assert "not a TCP port" in capsys.readouterr().err


def test_an_unknown_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--fleet", "f.json", "--log-level", "loud"])
    assert info.value.code == 2


def test_a_missing_fleet_file_exits_2_naming_it(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "absent.json"
    assert main(["--fleet", str(path)]) == 2
    captured = capsys.readouterr()
    assert str(path) in captured.err and "cannot be read" in captured.err
    assert _result(captured.out)["ok"] is False


def test_a_bad_document_exits_2_listing_every_problem(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({**GOOD, "slo": {"ttft_s": 0, "tpot_s": 0.1}, "extra": 1}))
    assert main(["--fleet", str(path)]) == 2
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "slo.ttft_s" in err and "extra: unknown key" in err


def test_a_missing_tenant_key_variable_exits_2_naming_the_variable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NW_CLI_TEST_KEY", raising=False)
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({**GOOD, "tenants": [{"name": "a", "key_env": "NW_CLI_TEST_KEY"}]}))
    assert main(["--fleet", str(path)]) == 2
    assert "NW_CLI_TEST_KEY is not set" in capsys.readouterr().err


def test_an_unusable_journal_path_fails_at_startup_not_on_the_first_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({**GOOD, "journal": {"path": str(blocker / "journal.jsonl")}}))
    assert main(["--fleet", str(path), "--port", "1"]) == 1
    captured = capsys.readouterr()
    assert "journal" in captured.err
    assert _result(captured.out)["ok"] is False
