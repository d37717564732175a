"""The runbook's evidence names (runs/discovery/<run>/, runs/access-<id>/) lead to our folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.core.errors import GateBlocked
from narwhal.deploy.ledger import Ledger


def test_every_discovery_and_access_attempt_is_named_as_the_runbook_names_it(
        tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    with ledger.attempt("access", fingerprint={}, hosts={}) as first:
        pass
    with pytest.raises(GateBlocked), ledger.attempt("discover", fingerprint={}, hosts={}) as a:
        a.block("a host is down")
    with ledger.attempt("discover", fingerprint={}, hosts={}) as b:
        pass
    doc = json.loads((ledger.root / "runbook-index.json").read_text())
    assert doc["schema"] == "narwhal.runbook-index"
    assert doc["names"] == {f"access-{first.id}": f"access/{first.id}",
                            f"discovery/{a.id}": f"discover/{a.id}",
                            f"discovery/{b.id}": f"discover/{b.id}"}
    for folder in doc["names"].values():
        assert (ledger.root / folder / "attempt.json").exists()
