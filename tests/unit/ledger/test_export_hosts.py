"""An export leaves out the hosts' own names, which tools on the hosts print though no input
names them (Gate A records them)."""

from __future__ import annotations

import json
from pathlib import Path

from narwhal.deploy.inputs import load_inputs
from narwhal.deploy.ledger.export import export
from tests.unit.ledger.records import ledger_for_valid_env


def test_host_names_gate_a_found_are_aliased_wherever_the_record_holds_them(
        tmp_path: Path) -> None:
    ledger = ledger_for_valid_env(tmp_path).ensure()
    facts = ledger.root / "discover" / "001-x"
    facts.mkdir(parents=True)
    (facts / "host-facts-node-1.json").write_text(json.dumps({"hostname": "gpu-rack7-a"}))
    (facts / "host-facts-node-2.json").write_text(json.dumps({"hostname": ["not", "a", "name"]}))
    (facts / "host-facts-node-3.json").write_text("{torn")
    run = ledger.root / "fabric" / "001-y"
    run.mkdir(parents=True)
    (run / "sample.txt").write_text("Connecting to host gpu-rack7-a, port 5201\n"
                                    '{"holder_id": "gpu-rack7-a-539-9850ac7c"}\n'
                                    "gpu-rack7-ab is another host\n")
    out = tmp_path / "export"
    manifest = export(ledger, load_inputs(tmp_path / ".env"), out)
    text = (out / "fabric" / "001-y" / "sample.txt").read_text()
    assert "gpu-rack7-a," not in text and "gpu-rack7-a-539" not in text
    assert text.count("host-") >= 2 and "gpu-rack7-ab" in text  # a longer name is not it
    assert any(a.startswith("host-") for a in manifest["aliases"]["host"])
