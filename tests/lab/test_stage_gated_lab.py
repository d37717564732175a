"""A gated repo in the lab's hub: Gate A without the token blocks naming NARWHAL_HF_TOKEN and
stages nothing; with it every engine host stages, and the token is nowhere the product writes
or runs: not in the record (command lines included), not in its export, not in any file on the
hosts, not in the hub's own log.

Its own small lab (router and two engine hosts, empty model dirs, a gated hub), beside the
session's default lab, on other subnets.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.lab.installing import REPO
from tests.lab.operator import NARWHAL

from narwhal.deploy.package import wheelhouse
from narwhal.deploy.package.lock import load_lock
from narwhal.lab import envfile, labhub, lifecycle, spec
from narwhal.lab.defaults import default_spec_document
from narwhal.lab.plan import LabPlan

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]
NAME = "gtd"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _spec() -> spec.LabSpec:
    doc = copy.deepcopy(default_spec_document())
    doc["name"] = NAME
    doc["management"]["subnet"], doc["fabric"]["subnet"] = "10.221.0.0/24", "10.222.0.0/24"
    doc["hosts"] = [h for h in doc["hosts"] if h["name"] in ("router", "eng1", "eng2")]
    doc["model"]["hub"] = True
    doc["hub"] = {"port": 8600, "gated": True}
    return spec.validate(doc, "gated lab")


@pytest.fixture(scope="module")
def gated(lab: LabPlan) -> Iterator[LabPlan]:
    lifecycle.down(NAME)
    plan = lifecycle.up(_spec())
    try:
        yield plan
    finally:
        lifecycle.down(NAME)


@pytest.fixture(scope="module")
def wheels() -> Path:
    lock_path = REPO / "runtime.lock"
    folder = REPO / ".cache" / f"wheelhouse-{hashlib.sha256(lock_path.read_bytes()).hexdigest()[:16]}"
    wheelhouse.build(folder, lock_path, load_lock(lock_path))
    return folder


def _narwhal(env: Path, runs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [NARWHAL, "lab", "exec", "--name", NAME, "--", NARWHAL, *args, "--env", str(env),
            "--runs", str(runs)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def _env(plan: LabPlan, path: Path, *, token: bool) -> Path:
    envfile.write(plan, path)
    lines = [ln for ln in path.read_text().splitlines()
             if token or not ln.startswith("NARWHAL_HF_TOKEN=")]
    path.write_text("\n".join([*lines, "NARWHAL_DEPLOYMENT=lab",
                               f"NARWHAL_DEPLOYMENT_REVISION={REVISION}"]) + "\n")
    path.chmod(0o600)
    return path


def _discover(env: Path, runs: Path, wheels: Path) -> dict[str, Any]:
    done = _narwhal(env, runs, "discover", "--json", "--wheelhouse", str(wheels))
    return dict(json.loads(done.stdout))


def _files_holding(root: Path, needle: bytes, skip: Path | None = None) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if skip is not None and p.is_relative_to(skip):
            continue
        if p.is_file() and not p.is_symlink():
            try:
                if needle in p.read_bytes():
                    found.append(str(p))
            except OSError:
                continue
    return found


def test_a_gated_repo_stages_only_with_the_token_and_the_token_is_written_nowhere(
        gated: LabPlan, wheels: Path, tmp_path: Path) -> None:
    access = labhub.hub_access(gated)
    assert access is not None and access.token_path is not None
    token = access.token_path.read_text().strip()
    runs = tmp_path / "runs"
    without = _env(gated, tmp_path / "without.env", token=False)
    assert _narwhal(without, runs, "hosts", "trust", "--yes").returncode == 0
    doc = _discover(without, runs, wheels)
    assert doc["verdict"] == "blocked" and "NARWHAL_HF_TOKEN" in json.dumps(doc), doc
    model = gated.spec.model.dir.lstrip("/")
    hosts = {h.name: h.dir / model for h in gated.engines()}
    assert all(not any(d.iterdir()) for d in hosts.values()), "nothing staged without a token"

    with_token = _env(gated, tmp_path / "with.env", token=True)
    doc = _discover(with_token, runs, wheels)
    assert doc["verdict"] == "passed", doc
    assert {e["model"]["model_tree_sha256"] for e in doc["engines"]} == {
        doc["checkpoint"]["tree_sha256"]}
    assert doc["checkpoint"]["gated"] in ("manual", True)

    out = tmp_path / "export"
    exported = _narwhal(with_token, runs, "record", "export", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    secret = token.encode()
    assert _files_holding(runs, secret) == []  # the record: argv, outputs, evidence
    assert _files_holding(out, secret) == []  # the export
    assert _files_holding(gated.dir / "hosts", secret) == []  # every file on every host
    assert _files_holding(gated.dir, secret, skip=gated.dir / "hosts") == [
        str(access.token_path)]  # the lab's own grant, and nothing else (the hub's log too)
