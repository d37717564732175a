"""narwhal-check on the default lab fleet (4 emulated engines, 12 ordered pairs, timing model on),
run from the router host's namespace as Gate F does: after narwhal-profile it passes with a
handoff time for every pair; a shaped fabric edge makes exactly the pairs across it miss the
first-token deadline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.faults import Faults
from narwhal.lab.lab_fleet import LabFleet, lab_fleet

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]
RATE = "8mbit"  # 1 MB/s: a 1000-token prompt's KV (2 KiB per token) takes about 2 s to cross
KV_TOKENS = "1000"
DEADLINE_S = 1.0  # unshaped handoffs of that prompt take about 0.1-0.3 s


def check(fleet: LabFleet, *args: str) -> tuple[int, dict[str, Any]]:
    done = fleet.run("narwhal.serve.check_cli", "--fleet", str(fleet.fleet_path), "--json", *args)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    document: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, document


def kv_rows(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["subject"]: v for v in document["verdicts"] if v["gate"] == "kv"}


def test_profile_then_check_passes_and_a_shaped_edge_fails_exactly_its_pairs(
        faults: Faults, tmp_path: Path) -> None:
    with lab_fleet(faults.plan, tmp_path) as fleet:
        profiled = fleet.run("narwhal.serve.profile_cli", "--fleet", str(fleet.fleet_path))
        assert profiled.returncode == 0, profiled.stderr[-3000:]

        code, doc = check(fleet)
        rows = kv_rows(doc)
        assert code == 0, [v for v in doc["verdicts"] if v["status"] == "fail"]
        assert len(rows) == 12 and all(v["status"] == "pass" for v in rows.values())
        for subject, v in rows.items():
            print(subject, f"first token {v['values']['first_token_s']:.3f} s, "
                           f"handoff {v['values']['handoff_s']:.3f} s")
            assert v["values"]["handoff_s"] > 0

        ids = [e["id"] for e in json.loads(fleet.fleet_path.read_text())["engines"]]
        across = {f"{p}->{c}" for p in ids for c in ids
                  if p.startswith("eng1-") and c.startswith("eng2-")}
        fleet.write(serving={"first_token_timeout_s": DEADLINE_S})
        faults.shape("eng1", "eng2", RATE)
        try:
            code, doc = check(fleet, "--kv-tokens", KV_TOKENS)
        finally:
            faults.clear()
        rows = kv_rows(doc)
        failed = {s for s, v in rows.items() if v["status"] == "fail"}
        for subject, v in sorted(rows.items()):
            print(subject, v["status"], v["measured"])
        assert code == 1
        assert failed == across
        for subject in across:
            assert "misses the router's deadline" in rows[subject]["detail"]
            assert rows[subject]["values"]["first_token_s"] > DEADLINE_S
        assert {s for s, v in rows.items() if v["status"] == "pass"} == set(rows) - across
