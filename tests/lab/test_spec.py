"""The lab spec refuses bad input with every problem at once (no root needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.lab import spec
from narwhal.lab.defaults import default_spec_document


def _doc() -> dict[str, Any]:
    return copy.deepcopy(default_spec_document())


def test_default_spec_is_a_router_and_three_engine_hosts_of_two_gpus() -> None:
    s = spec.load(None)
    assert [h.role for h in s.hosts] == ["router", "engine", "engine", "engine"]
    assert all(h.hardware and h.hardware.accelerators.count == 2 for h in s.engines())
    assert all(h.hardware and h.hardware.rdma == [] for h in s.engines())
    assert [u.auth for h in s.hosts for u in h.users].count("password") == 1


def test_unknown_key_is_refused_and_named() -> None:
    doc = _doc()
    doc["hosts"][1]["hardwre"] = {}
    with pytest.raises(InputError) as err:
        spec.validate(doc, "lab.json")
    assert any(p.field == "hosts.1.hardwre" and "typo" in p.fix for p in err.value.problems)


def test_every_problem_is_reported_at_once() -> None:
    doc = _doc()
    doc["hosts"][0]["role"] = "engine"  # no router, and an engine without inventory
    doc["hosts"][1]["hardware"]["accelerators"]["count"] = 3
    doc["fabric"]["subnet"] = "10.213.0.0/24"  # overlaps management
    with pytest.raises(InputError) as err:
        spec.validate(doc, "lab.json")
    fields = {p.field for p in err.value.problems}
    assert {"hosts", "hosts.0.hardware", "hosts.1.hardware.accelerators.devices", "fabric.subnet"} <= fields


def test_wrong_types_and_vendor_are_refused_together() -> None:
    doc = _doc()
    doc["hosts"][1]["hardware"]["accelerators"]["vendor"] = "Intel"
    doc["management"]["mtu"] = "1500"  # strict: a string is not an int
    with pytest.raises(InputError) as err:
        spec.validate(doc, "lab.json")
    fields = {p.field for p in err.value.problems}
    assert {"hosts.1.hardware.accelerators.vendor", "management.mtu"} <= fields


def test_schema_name_and_version_are_required(tmp_path: Path) -> None:
    doc = _doc()
    doc["schema_version"] = 2
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        spec.load(path)
    assert err.value.problems[0].field == "schema_version"


def test_unreadable_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "lab.json"
    path.write_text('{\n "schema": ,\n}')
    with pytest.raises(InputError) as err:
        spec.load(path)
    assert err.value.problems[0].field == "line 2"


def test_a_model_is_a_config_or_a_real_checkpoint_folder_never_both(tmp_path: Path) -> None:
    doc = _doc()
    doc["model"]["source"] = str(tmp_path)  # both, and the folder has no config.json
    with pytest.raises(InputError) as err:
        spec.validate(doc, "lab.json")
    fields = {p.field for p in err.value.problems}
    assert fields == {"model", "model.source"}
    del doc["model"]["config"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    loaded = spec.validate(doc, "lab.json")
    assert loaded.model.checkpoint_config() == {"model_type": "llama"}


def test_a_real_vllm_image_needs_a_site_packages_that_holds_vllm(tmp_path: Path) -> None:
    doc = _doc()
    doc["image"]["vllm_site"] = str(tmp_path)
    with pytest.raises(InputError) as err:
        spec.validate(doc, "lab.json")
    assert [p.field for p in err.value.problems] == ["image.vllm_site"]
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    assert spec.validate(doc, "lab.json").image.vllm_site == str(tmp_path)
