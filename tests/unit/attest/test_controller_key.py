"""The deployment's controller key: made once, private, and never in an export of the record."""

from __future__ import annotations

import stat
from pathlib import Path

from narwhal.core.key_file import read_key_file
from narwhal.deploy.gates.attest import KEY_FILE, controller_key
from narwhal.deploy.inputs import load_inputs
from narwhal.deploy.ledger.export import export
from tests.unit.ledger.records import ledger_for_valid_env


def test_the_key_is_made_once_private_and_readable_by_both_ends(tmp_path: Path) -> None:
    ledger = ledger_for_valid_env(tmp_path).ensure()
    key = controller_key(ledger)
    assert controller_key(ledger) == key  # the same key on every later attest
    path = ledger.root / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (tmp_path / "b").mkdir()
    other = controller_key(ledger_for_valid_env(tmp_path / "b").ensure())
    assert other != key  # one per deployment record, random
    assert read_key_file(path, "key_file").reveal() == key.decode().strip()


def test_an_export_of_the_record_leaves_the_key_out(tmp_path: Path) -> None:
    ledger = ledger_for_valid_env(tmp_path).ensure()
    key = controller_key(ledger).strip()
    out = tmp_path / "export"
    export(ledger, load_inputs(tmp_path / ".env"), out)
    for f in out.rglob("*"):
        if f.is_file():
            assert key not in f.read_bytes(), f
    assert not (out / KEY_FILE).exists()
