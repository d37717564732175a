"""A prepared run sends every secret its roles need, the per-variable engine secrets under
secrets/env/ included, and reading the run back finds each in the `.env` again."""

from __future__ import annotations

import json
from pathlib import Path

from narwhal.deploy.gates.install import load_prepared
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.package import prepared as prep
from narwhal.deploy.package.lock import Lock
from narwhal.deploy.package.rolefiles import role_files
from tests.envtext import REVISION, valid_env

ROUTER_KEY = "r" * 24


def test_a_prepared_run_with_engine_secrets_reads_back_with_every_value(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text(valid_env(NARWHAL_ROUTER_API_KEY=ROUTER_KEY,
                             NARWHAL_HF_TOKEN="hf_" + "h" * 30))
    env.chmod(0o600)
    inputs = parse_inputs(env.read_text(), env)
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    built = {name: prep.SendFile(name, tmp_path / f"{name.replace(':', '-')}.whl", "ab" * 32)
             for name in ("bundle", "narwhal:pure", "narwhal:compiled")}
    hosts = {"node-1": ["engine-1", "router"], "node-2": ["engine-2"]}
    roles = role_files(inputs, ["engine-1", "router", "engine-2"])
    run_id = prep.prepare(ledger, inputs.deployment, REVISION,
                          Lock("cp311", "manylinux_x86_64", ()), built, hosts, roles,
                          {"engine-1": b"{}\n", "engine-2": b"{}\n"}, b"{}\n", {})
    manifest = json.loads((ledger.root / "deployment-env" / run_id / "manifest.json")
                          .read_text())
    assert "sk-engine" not in json.dumps(manifest) and ROUTER_KEY not in json.dumps(manifest)
    run = load_prepared(ledger, run_id, inputs)
    sent = {h.alias: h.secrets for h in run.hosts}
    at = f"runs/{run_id}/secrets"
    assert sent["node-2"][f"{at}/env/VLLM_API_KEY"] == "sk-engine-ffffffff"
    assert sent["node-2"][f"{at}/env/HF_TOKEN"] == "hf_" + "h" * 30
    assert sent["node-1"][f"{at}/NARWHAL_ROUTER_API_KEY"] == ROUTER_KEY
    assert f"{at}/NARWHAL_ROUTER_API_KEY" not in sent["node-2"]
