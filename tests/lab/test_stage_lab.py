"""Gate A stages the checkpoint from the lab's hub double onto every engine host, through the
product's own path: `narwhal discover` pins the revision with huggingface_hub on the
workstation, sends the hosts the stage kit, and each host downloads with the hub client.

The default lab's hosts already hold the model in their own model dir; this module stages
into another, empty one (NARWHAL_MODEL_DIR=/srv/models/staged) with its own record, so the
shared fleet's deployment is untouched.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.lab.fleet_up import clear_containers, stop_sidecars
from tests.lab.installing import Installer
from tests.lab.operator import NARWHAL, Operator

from narwhal.lab import envfile, labhub
from narwhal.lab.faults import Faults
from narwhal.lab.hostfs import write_model_files
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]
STAGED = "/srv/models/staged"
ENGINES = ("eng1", "eng2", "eng3")  # lab hosts; the record names them by alias
ALIAS = {"eng1": "node-1", "eng2": "node-2", "eng3": "node-3"}
NODES = tuple(ALIAS.values())


@pytest.fixture(scope="module")
def operator(lab: LabPlan, installer: Installer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    access = labhub.hub_access(lab)
    assert access is not None, "the default lab serves its model from the hub"
    work = tmp_path_factory.mktemp("stage")
    env = work / ".env"
    envfile.write(lab, env)
    with env.open("a") as fh:
        fh.write(f"NARWHAL_DEPLOYMENT=lab\nNARWHAL_DEPLOYMENT_REVISION={installer.revision}\n")
    op = Operator(lab, env, work / "runs")
    op = Operator(lab, op.variant("staged", NARWHAL_MODEL_DIR=STAGED,
                                  MODEL_REPO_ID=access.repo_id, MODEL_REVISION="main",
                                  HF_ENDPOINT=access.endpoint), work / "runs")
    trusted = op.narwhal("hosts", "trust", "--yes")
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    for host in ENGINES:
        ssh(lab, host, f"rm -rf {STAGED}")
    try:
        yield op
    finally:
        _undeploy(op, installer)
        for host in ENGINES:
            ssh(lab, host, f"rm -rf {STAGED}")


def _undeploy(op: Operator, installer: Installer) -> None:
    """End what this module's deploy started (by its owner records) and its containers, so
    Gate A finds the engine ports free again and later modules find the hosts as they were."""
    stop_sidecars(Installer(op, installer.checkout, installer.wheels, installer.revision,
                            "", "", ""))
    clear_containers(op.plan)


def _discover(op: Operator, installer: Installer, *extra: str) -> tuple[int, dict[str, Any]]:
    return op.json_command("discover", "--wheelhouse", str(installer.wheels), *extra)


def _staging(op: Operator) -> dict[str, Any]:
    doc = json.loads((op.last_attempt("discover") / "staging.json").read_text())
    doc["by_host"] = {h["host"]: h for h in doc["hosts"]}
    return dict(doc)


def _sha(lab: LabPlan, host: str, path: str) -> str:
    return ssh(lab, host, f"sha256sum {path}").stdout.split()[0]


def _attempts(op: Operator) -> dict[str, list[str]]:
    doc = json.loads((op.runs / "lab" / "ledger.json").read_text())
    return {g: list(e["attempts"]) for g, e in doc["gates"].items()}


def test_deploy_stages_empty_model_dirs_then_passes_every_gate_and_again_moves_nothing(
        operator: Operator, installer: Installer, lab: LabPlan) -> None:
    deploy = ("deploy", "--checkout", str(installer.checkout), "--wheelhouse",
              str(installer.wheels), "--fabric-seconds", "1")
    try:
        code, doc = operator.json_command(*deploy)
        assert code == 0 and doc["verdict"] == "passed", doc
        assert [(s["letter"], s["action"]) for s in doc["steps"]] == [
            (g, "ran") for g in "ABCDEFG"]
        staged = _staging(operator)
        assert {h: staged["by_host"][h]["outcome"] for h in NODES} == {
            h: "staged" for h in NODES}
        before = _attempts(operator)
        code, doc = operator.json_command(*deploy)
        assert code == 0 and [s["action"] for s in doc["steps"]] == ["kept"] * 7, doc
        assert _attempts(operator) == before  # nothing ran, so nothing was staged or sent
    finally:
        _undeploy(operator, installer)


def test_discovery_stages_at_the_pinned_commit_and_a_rerun_moves_nothing(
        operator: Operator, installer: Installer, lab: LabPlan) -> None:
    for host in ENGINES:  # empty again: Gate A stages every file on every host
        ssh(lab, host, f"find {STAGED} -type f -delete")
    code, doc = _discover(operator, installer)
    assert code == 0 and doc["verdict"] == "passed", doc
    pin = doc["checkpoint"]
    assert pin["revision"] == "main" and len(pin["commit"]) == 40
    assert pin["card"]["license"] == "apache-2.0" and pin["card"]["pipeline_tag"]
    staged = _staging(operator)
    assert {h: staged["by_host"][h]["outcome"] for h in NODES} == {h: "staged" for h in NODES}
    assert staged["bytes"]["from_hub"] == 3 * pin["bytes"]
    digests = {e["model"]["model_tree_sha256"] for e in doc["engines"]}
    assert digests == {pin["tree_sha256"]}
    launch = json.loads((operator.last_attempt() / "launch-engine-1.json").read_text())
    assert launch["environment"]["HF_HUB_OFFLINE"] == "1"

    code, doc = _discover(operator, installer)  # everything there: nothing sent, nothing fetched
    assert code == 0, doc
    again = _staging(operator)
    assert {h: again["by_host"][h]["outcome"] for h in NODES} == {h: "kept" for h in NODES}
    assert again["bytes"] == {"from_hub": 0, "from_workstation": 0, "relayed": 0,
                              "between_hosts": 0}


def test_a_new_commit_on_main_changes_nothing_until_the_revision_changes(
        operator: Operator, installer: Installer, lab: LabPlan, tmp_path: Path) -> None:
    code, first = _discover(operator, installer)
    assert code == 0, first
    folder = tmp_path / "next"
    write_model_files(lab.spec, folder)
    (folder / "model.safetensors").write_bytes(labhub.weights())
    (folder / "config.json").write_text('{"model_type": "llama", "pushed": true}\n')
    (folder / "generation_config.json").unlink()
    pushed = subprocess.run([NARWHAL, "lab", "hub", "push", "--from", str(folder)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert pushed.returncode == 0, pushed.stderr
    new_commit = pushed.stdout.split()[-1]
    code, doc = _discover(operator, installer)
    assert code == 0 and doc["checkpoint"]["commit"] == first["checkpoint"]["commit"], doc
    assert doc["checkpoint"]["pinned_earlier"] is True
    assert "pushed" not in ssh(lab, "eng1", f"cat {STAGED}/config.json").stdout

    moved = operator.variant("moved", MODEL_REVISION=new_commit)  # the operator's change
    code, doc = operator.json_command("discover", "--wheelhouse", str(installer.wheels),
                                      env=moved)
    assert code == 0 and doc["checkpoint"]["commit"] == new_commit, doc
    changed = _staging(operator)
    assert changed["replaces"] == first["checkpoint"]["commit"]
    assert changed["by_host"]["node-1"]["files"] == {"config.json": "repaired",
                                                     "generation_config.json": "removed"}
    for host in ENGINES:
        assert "pushed" in ssh(lab, host, f"cat {STAGED}/config.json").stdout
        assert ssh(lab, host, f"test -e {STAGED}/generation_config.json").returncode != 0
    code, doc = _discover(operator, installer)  # main is that commit now: nothing moves
    assert code == 0 and doc["checkpoint"]["commit"] == new_commit, doc


def test_one_changed_byte_is_named_and_left_alone_then_repaired_alone_with_consent(
        operator: Operator, installer: Installer, lab: LabPlan) -> None:
    assert _discover(operator, installer)[0] == 0
    shard = f"{STAGED}/model.safetensors"
    good = _sha(lab, "eng1", shard)
    ssh(lab, "eng2", f"printf 'X' | dd of={shard} bs=1 seek=4096 conv=notrunc status=none")
    bad = _sha(lab, "eng2", shard)
    assert bad != good
    code, doc = _discover(operator, installer)
    assert code != 0 and doc["verdict"] == "blocked", doc
    assert "node-2: model.safetensors" in json.dumps(doc), doc
    assert _sha(lab, "eng2", shard) == bad, "without consent nothing is changed"
    code, doc = _discover(operator, installer, "--repair-checkpoint")
    assert code == 0 and doc["verdict"] == "passed", doc
    repaired = _staging(operator)["by_host"]["node-2"]
    assert repaired["files"] == {"model.safetensors": "repaired"}
    assert _sha(lab, "eng2", shard) == good


def test_a_host_with_no_route_to_the_hub_gets_the_files_relayed(
        operator: Operator, installer: Installer, lab: LabPlan, faults: Faults) -> None:
    assert _discover(operator, installer)[0] == 0
    ssh(lab, "eng3", f"rm -f {STAGED}/model.safetensors {STAGED}/config.json")
    faults.hub_cut("eng3")
    assert ssh(lab, "eng3", f"curl -sS -m 3 {labhub.endpoint(lab)}/api/models").returncode != 0
    code, doc = _discover(operator, installer)
    assert code == 0 and doc["verdict"] == "passed", doc
    relayed = _staging(operator)
    eng3 = relayed["by_host"]["node-3"]
    assert eng3["outcome"] == "relayed" and eng3["donor"] in ("node-1", "node-2")
    assert set(eng3["files"]) == {"model.safetensors", "config.json"}
    assert relayed["bytes"]["relayed"] == eng3["relayed_bytes"] > 0
    assert relayed["bytes"]["from_hub"] == 0
    assert _sha(lab, "eng3", f"{STAGED}/model.safetensors") == _sha(
        lab, "eng1", f"{STAGED}/model.safetensors")


def test_a_fleet_with_no_route_to_the_hub_gets_the_files_from_the_workstation(
        operator: Operator, installer: Installer, lab: LabPlan, faults: Faults) -> None:
    assert _discover(operator, installer)[0] == 0
    for host in ENGINES:
        ssh(lab, host, f"rm -f {STAGED}/tokenizer.json")
        faults.hub_cut(host)
    code, doc = _discover(operator, installer)
    assert code == 0 and doc["verdict"] == "passed", doc
    relayed = _staging(operator)
    assert {h: (relayed["by_host"][h]["outcome"], relayed["by_host"][h]["donor"])
            for h in NODES} == {h: ("relayed", "workstation") for h in NODES}
    assert relayed["bytes"]["from_hub"] == 0
    assert relayed["bytes"]["relayed"] == 3 * relayed["by_host"]["node-1"]["relayed_bytes"] > 0
