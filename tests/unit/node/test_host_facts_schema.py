"""The workstation reads host facts through one strict schema; a mismatch names the host alias
and the first bad field, while failures on the host (a missing tool, nvidia-smi without a
driver) are facts the schema accepts."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from narwhal.core.errors import ContractError
from narwhal.core.host_facts import TOOL_NAMES, first_differing_path, parse_host_facts
from narwhal.node import host_probe
from tests.unit.node.helpers import NO_DRIVER


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    model = tmp_path_factory.mktemp("model")
    (model / "config.json").write_text("{}")
    request = {"schema": "narwhal.host-probe-request", "schema_version": 1, "role": "engine",
               "run_dir": str(model), "model_dir": str(model), "fabric_interface": "lo",
               "ports": [22], "image": None, "runtime": None, "hash_model": True}
    return host_probe.host_facts(request)


def test_the_probes_document_validates_and_dumps_back_unchanged(document: dict[str, Any]) -> None:
    facts = parse_host_facts(document, "node-1")
    assert facts.model_dump(mode="json", by_alias=True) == document
    assert set(facts.tools) == set(TOOL_NAMES) == set(host_probe.TOOLS)
    assert facts.missing_tools(["python3"]) == []


def test_the_probe_and_the_schema_agree_on_the_recipe_and_tool_list() -> None:
    from narwhal.core import host_facts

    assert host_probe.ROWS_RECIPE == host_facts.ROWS_RECIPE
    assert (host_probe.FACTS_SCHEMA, host_probe.VERSION) == (host_facts.SCHEMA, host_facts.VERSION)


def test_a_failed_gpu_tool_is_a_fact_not_a_contract_error(document: dict[str, Any]) -> None:
    doc = copy.deepcopy(document)
    doc["accelerators"] = {"vendor": "nvidia", "gpus": [], "driver_version": None,
                           "error": f"nvidia-smi exited 9: {NO_DRIVER}"}
    doc["tools"]["git"] = {"path": None, "version": None}
    facts = parse_host_facts(doc, "node-1")
    assert facts.accelerators.error is not None and facts.missing_tools(["git", "python3"]) == ["git"]


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(schema_version=2), "narwhal.host-facts v1"),
    (lambda d: d.update(extra=1), "field extra: Extra inputs are not permitted"),
    (lambda d: d["python"].update(has_venv="yes"), "field python.has_venv"),
    (lambda d: d["model"]["rows"][0].__setitem__(1, "12"), "field model.rows.0.1"),
    (lambda d: d["tools"].pop("git"), "field tools: Value error, tools must be exactly"),
    (lambda d: d["accelerators"].update(gpus=[{"index": 0, "name": "x", "uuid": "GPU-1",
                                               "pci_bus_id": "00000000:17:00.0",
                                               "memory_total_mib": 1, "numa_node": None}]),
     "field accelerators.gpus.0.pci_bus_id"),
    (lambda d: d.pop("listeners"), "field listeners: Field required"),
])
def test_a_document_off_contract_names_the_host_and_the_first_bad_field(
        document: dict[str, Any], change: Any, field: str) -> None:
    doc = copy.deepcopy(document)
    change(doc)
    with pytest.raises(ContractError) as caught:
        parse_host_facts(doc, "node-2")
    assert str(caught.value).startswith("node-2: ")
    assert field in str(caught.value)


def test_nan_cannot_pass_as_a_fact(document: dict[str, Any]) -> None:
    doc = json.loads(json.dumps(document))
    doc["disk"][next(iter(doc["disk"]))]["free_bytes"] = float("nan")
    with pytest.raises(ContractError, match="node-3: host facts are not plain JSON"):
        parse_host_facts(doc, "node-3")


def test_the_first_differing_path_between_two_hosts_rows() -> None:
    a = [["a.json", 1, "0" * 64], ["b.bin", 2, "1" * 64], ["c.txt", 3, "2" * 64]]
    b = [["a.json", 1, "0" * 64], ["b.bin", 2, "9" * 64], ["c.txt", 3, "8" * 64]]
    assert first_differing_path(a, b) == "b.bin"
    assert first_differing_path(a, a[:2]) == "c.txt"
    assert first_differing_path(a, [list(r) for r in a]) is None


def test_rows_are_read_as_path_size_sha256(document: dict[str, Any]) -> None:
    facts = parse_host_facts(document, "node-1")
    assert facts.model is not None
    path, size, sha = facts.model.rows[0]
    assert (path, size) == ("config.json", 2) and len(sha) == 64
