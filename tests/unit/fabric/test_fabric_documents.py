"""Gate D's documents are held to core's models where they are written, byte for byte as
before, and read back through them: a record a reader cannot trust is named, field by field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.documents import canonical_json, sha256_bytes
from narwhal.core.errors import InputError
from narwhal.core.fabric_edges import (
    checked_budget,
    checked_diagnosis,
    checked_edges,
    checked_links,
    checked_sample,
    parse_edges,
    parse_links,
)
from narwhal.deploy.fabric import diagnose as dx
from narwhal.deploy.fabric.budget import budget_document
from narwhal.deploy.fabric.links import Interface, LinkRecord, Route
from narwhal.deploy.fabric.matrix import EdgeRow, edges_document, row_from
from narwhal.deploy.gates.fabric import previous_rows
from narwhal.deploy.inputs.model import Workload
from tests.unit.kv.helpers import LLAMA, geometry


def _link(edge: str = "node-1->node-2") -> LinkRecord:
    src, dst = edge.split("->")
    return LinkRecord(
        edge=edge, source=src, destination=dst, source_address="10.0.0.1",
        destination_address="10.0.0.2",
        source_interface=Interface("fab0", "10.0.0.1", ("10.0.0.1",), 9000, True),
        destination_interface=Interface("fab0", None, (), None, False),
        route=Route("fab0", "10.0.0.1", None), reverse_route=Route("", None, None),
        transport={"source": {"transport": "ucx_tcp", "net_devices": None, "ucx": {}},
                   "destination": {"transport": "ucx_tcp", "net_devices": "fab0",
                                   "ucx": {"UCX_TLS": "tcp"}}},
        tool_version="iperf 3.12",
        test_parameters={"tool": "iperf3", "seconds": 10, "port": 5201, "omit_s": 1,
                         "parallel": 1},
        host_keys={src: "SHA256:a", dst: "SHA256:b"})


ROWS = [EdgeRow("a->b", "a", "b", 0.02, 9.1, "pass", "sha256:1", "001", True,
                "edge-a-to-b.json", None),
        EdgeRow("b->a", "b", "a", 0.02, None, "fail", "sha256:2", "002", False, None, None,
                ("host",)),
        EdgeRow("a->c", "a", "c", 0.02, 0.01, "void", "sha256:3", "002", False,
                "edge-a-to-c.json", "edge-a-to-c.diagnosis.json", ("traffic",))]


def test_the_budget_gate_d_computes_is_the_budget_its_model_holds() -> None:
    g1 = geometry("llama-3.1-8b", LLAMA, tensor_parallel_size=1)
    g2 = geometry("llama-3.1-8b", LLAMA, tensor_parallel_size=2)
    doc, _ = budget_document({"e1": g1, "e2": g2}, {"e1": "a", "e2": "b"}, ["a", "b"],
                             Workload(handoffs_per_s=3.0, burst=2))
    assert checked_budget(doc) is doc  # written as built


def test_a_budget_with_a_misspelt_key_is_refused_before_it_is_written() -> None:
    g = geometry("llama-3.1-8b", LLAMA, tensor_parallel_size=1)
    doc, _ = budget_document({"e1": g, "e2": g}, {"e1": "a", "e2": "b"}, ["a", "b"],
                             Workload())
    doc["edges"]["a->b"]["requried_gbps"] = doc["edges"]["a->b"].pop("required_gbps")
    with pytest.raises(InputError) as got:
        checked_budget(doc)
    fields = [p.field for p in got.value.problems]
    assert "edges.a->b.requried_gbps" in fields and "edges.a->b.required_gbps" in fields


def test_links_round_trip_through_the_model_exactly() -> None:
    links = {e: _link(e) for e in ("node-1->node-2", "node-2->node-1")}
    doc = {edge: {**rec.document(), "fingerprint": rec.fingerprint}
           for edge, rec in links.items()}
    assert checked_links(doc) is doc
    read = parse_links(json.loads(canonical_json(doc)), "links.json")
    for edge, rec in links.items():
        assert read[edge].record() == rec.document()
        assert read[edge].fingerprint == rec.fingerprint


def test_a_link_record_that_is_not_one_is_named_by_its_edge_and_field() -> None:
    doc = {"a->b": {**_link("a->b").document(), "fingerprint": "sha256:x"}}
    doc["a->b"]["route"] = {"dev": "fab0", "source": None}
    with pytest.raises(InputError) as got:
        parse_links(doc, "links.json")
    assert [p.field for p in got.value.problems] == ["a->b.route.gateway"]
    with pytest.raises(InputError):
        parse_links([], "links.json")


def test_the_edge_matrix_round_trips_through_the_model() -> None:
    doc = edges_document(ROWS, ["a", "b", "c"])
    assert checked_edges(doc) is doc
    read = parse_edges(json.loads(canonical_json(doc)), "edges.json")
    assert [row_from(r.model_dump()) for r in read.edges] == ROWS


def test_an_edge_verdict_outside_pass_fail_void_is_refused() -> None:
    doc = edges_document(ROWS[:1], ["a", "b"])
    doc["edges"][0]["verdict"] = "passed"
    with pytest.raises(InputError) as got:
        checked_edges(doc)
    assert got.value.problems[0].field == "edges[0].verdict"


def test_a_sample_and_its_diagnosis_are_held_to_their_models() -> None:
    sample = {"edge": "a->b", "link_fingerprint": "sha256:1", "required_gbps": 0.02,
              "measured_gbps": None, "verdict": "fail", "idle_proof": {},
              "client_report": "iperf3: error - unable to connect"}
    assert checked_sample(sample, "edge-a-to-b.json") is sample
    causes = [dx.Cause("route", "the route leaves by mgmt0", "fix the route")]
    diagnosis = dx.document("a->b", causes, "edge-a-to-b.json")
    assert checked_diagnosis(diagnosis, "edge-a-to-b.diagnosis.json") is diagnosis
    with pytest.raises(InputError):
        checked_sample({**sample, "measured_gbps": "fast"}, "edge-a-to-b.json")


class _Ledger:
    """The part of a ledger previous_rows reads: the gate's attempts and their folders."""

    def __init__(self, root: Path, attempts: list[str]) -> None:
        self.root, self.attempts = root, attempts

    def exists(self) -> bool:
        return True

    def load(self) -> dict[str, Any]:
        return {"gates": {"fabric": {"attempts": self.attempts}}}

    def attempt_folder(self, gate: str, attempt: str) -> Path:
        return self.root / gate / attempt


def _attempt(root: Path, attempt: str, data: bytes, vouched: bool = True) -> None:
    folder = root / "fabric" / attempt
    folder.mkdir(parents=True)
    (folder / "edges.json").write_bytes(data)
    sha = sha256_bytes(data) if vouched else "0" * 64
    (folder / "attempt.json").write_text(json.dumps({"artifacts": {"edges.json": sha}}))


def test_previous_rows_take_each_edges_newest_vouched_row(tmp_path: Path) -> None:
    old = canonical_json(edges_document(ROWS, ["a", "b", "c"])).encode() + b"\n"
    newer = [EdgeRow("a->b", "a", "b", 0.02, 7.0, "pass", "sha256:9", "003", False,
                     "edge-a-to-b.json", None)]
    _attempt(tmp_path, "001", old)
    _attempt(tmp_path, "002", canonical_json(edges_document(newer, ["a", "b"])).encode())
    _attempt(tmp_path, "003", b"{}", vouched=False)  # edited since: not read at all
    rows = previous_rows(_Ledger(tmp_path, ["001", "002", "003"]))  # type: ignore[arg-type]
    assert rows == {"a->b": newer[0], "b->a": ROWS[1], "a->c": ROWS[2]}


def test_a_vouched_edge_matrix_that_is_not_one_is_named(tmp_path: Path) -> None:
    doc = edges_document(ROWS[:1], ["a", "b"])
    del doc["edges"][0]["fingerprint"]
    _attempt(tmp_path, "001", canonical_json(doc).encode())
    with pytest.raises(InputError) as got:
        previous_rows(_Ledger(tmp_path, ["001"]))  # type: ignore[arg-type]
    assert got.value.problems[0].field == "edges[0].fingerprint"
