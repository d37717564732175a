"""The lab's hub in the spec and at `lab up`, without root: the spec refuses a hub setting
that has nothing to act on, the hub has its own management address, and every lab's hub
holds the same two commits of the lab model while engine hosts start with an empty dir."""

from __future__ import annotations

import copy
import stat
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.lab import hostfs, labhub
from narwhal.lab.defaults import default_spec_document
from narwhal.lab.hub import access
from narwhal.lab.hub.store import Store
from narwhal.lab.plan import make_plan
from narwhal.lab.spec import LabSpec, validate


def _spec(**changes: Any) -> dict[str, Any]:
    """The default spec with its model held by the hub only (engine model dirs empty)."""
    doc = copy.deepcopy(default_spec_document())
    doc["model"]["hub"] = True
    doc.update(changes)
    return doc


def _fields(doc: dict[str, Any]) -> set[str]:
    with pytest.raises(InputError) as err:
        validate(doc, "test spec")
    return {p.field for p in err.value.problems}


def test_the_default_lab_serves_its_model_from_a_hub_every_host_can_reach() -> None:
    spec = validate(default_spec_document(), "default")
    assert spec.hub is not None and not spec.model.hub  # and on every engine host too
    assert all(h.hub_route for h in spec.hosts)


def test_hub_settings_without_a_hub_section_are_refused_naming_each() -> None:
    doc = _spec(hub=None)
    doc["hosts"][2]["hub_route"] = False
    assert _fields(doc) == {"model.hub", "hosts.2.hub_route"}


@pytest.mark.parametrize(("change", "field"), [
    ({"hub": {"port": 8600, "gatd": True}}, "hub.gatd"),
    ({"hub": {"port": 65535}}, "hub.port"),
    ({"hub": {"gated": "yes"}}, "hub.gated"),
])
def test_a_mistyped_hub_section_is_refused_by_its_path(change: dict[str, Any], field: str) -> None:
    assert field in _fields(_spec(**change))


def test_a_hub_model_needs_a_repo_id_and_no_host_may_be_called_hub() -> None:
    doc = _spec()
    doc["model"]["name"] = "tiny-llama"
    doc["hosts"][1]["name"] = "hub"
    assert _fields(doc) == {"model.name", "hosts.1.name"}


@pytest.fixture
def spec() -> LabSpec:
    return validate(default_spec_document(), "default")


def test_the_hub_has_its_own_namespace_and_management_address(spec: LabSpec, tmp_path: Path) -> None:
    plan = make_plan(spec, tmp_path)
    taken = {plan.ws_ip, *(h.mgmt_ip for h in plan.hosts)}
    assert plan.hub_ip not in taken and plan.hub_ip.startswith(spec.management.subnet.rsplit(".", 1)[0])
    assert plan.hub_netns == f"{spec.name}-hub"
    found = labhub.hub_access(plan)
    assert found is not None and found.endpoint == f"http://{plan.hub_ip}:8600"
    assert found.repo_id == spec.model.name and found.token_path is None


def test_every_lab_hub_holds_the_same_two_commits_files_then_card(spec: LabSpec, tmp_path: Path) -> None:
    ids = [labhub.build_store(make_plan(spec, tmp_path / lab)) for lab in ("a", "b")]
    assert ids[0] == ids[1]
    store = Store(labhub.store_dir(make_plan(spec, tmp_path / "a")))
    first, second = (store.commit(spec.model.name, c) for c in ids[0])
    assert first is not None and second is not None and second.parent == first.id
    assert store.resolve(spec.model.name, "main") == second
    expected = tmp_path / "expected"
    hostfs.write_model_files(spec, expected)
    assert set(first.files) == {p.name for p in expected.iterdir()} | {labhub.WEIGHTS_NAME}
    assert set(second.files) - set(first.files) == {"README.md"}
    assert first.files[labhub.WEIGHTS_NAME].lfs and first.files[labhub.WEIGHTS_NAME].size == 4 << 20


def test_a_gated_lab_hub_grants_only_the_token_in_its_0600_file(spec: LabSpec, tmp_path: Path) -> None:
    plan = make_plan(validate(_spec(hub={"gated": True}), "gated"), tmp_path)
    labhub.build_store(plan)
    found = labhub.hub_access(plan)
    assert found is not None and found.token_path is not None
    assert stat.S_IMODE(found.token_path.stat().st_mode) == 0o600
    settings = Store(labhub.store_dir(plan)).settings(spec.model.name)
    token = found.token_path.read_text().strip()
    assert access.decide(settings, token, "files") is access.Verdict.ALLOW
    assert access.decide(settings, None, "files") is access.Verdict.GATED_LOG_IN


def test_engine_hosts_start_with_an_empty_model_dir_when_the_hub_holds_the_model(
        tmp_path: Path) -> None:
    spec = validate(_spec(), "hub model")
    plan = make_plan(spec, tmp_path)
    for h in plan.hosts:
        hostfs._model(plan, h)
    dirs = {h.name: h.dir / spec.model.dir.lstrip("/") for h in plan.hosts}
    assert [list(dirs[h.name].iterdir()) for h in plan.engines()] == [[]] * len(plan.engines())
    assert not dirs["router"].exists()
