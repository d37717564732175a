"""`narwhal engines --recapture` refuses what names no engine before anything is recorded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.gates.engines import carried_captures
from tests.unit.ledger.records import ledger_for_valid_env

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("value", ["engine-1,,engine-2", "engine-1,engine-1", ",", ""])
def test_a_malformed_list_is_a_usage_error(value: str, tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "narwhal"), "engines", "--recapture", value, "--runs",
                           str(tmp_path / "runs")], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--recapture" in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing recorded


def test_an_engine_of_no_deployment_is_named_with_the_engines_there_are(tmp_path: Path) -> None:
    ledger = ledger_for_valid_env(tmp_path)
    with pytest.raises(InputError) as caught:
        carried_captures(ledger, [], ["engine-9"])
    [problem] = caught.value.problems
    assert problem.field == "--recapture" and "engine-9" in problem.problem
    assert not ledger.exists()
