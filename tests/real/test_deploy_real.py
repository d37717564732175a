"""The rehearsal on real vLLM: `narwhal deploy` on a lab of two engine hosts whose image runs
real vLLM CPU (the cached venv of this tier) instead of the emulator.

The lab swaps the world, not the code: the engine hosts are network namespaces with the docker
double, and the image's `vllm` is real vLLM 0.32 (lab spec `image.vllm_site`); the checkpoint
is the tier's tiny Llama (`model.source`). Everything else is the product as an operator runs
it from the workstation namespace: trust the host keys, then `narwhal deploy` runs Gates A to
G. Gate C starts both engines through SSH and the hosts' docker and captures their live KV
cache; the two engines sit in different namespaces, so every KV byte of Gate F's contract and
of the trial crosses the lab's fabric (UCX over TCP on `fab0`), never loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.documents import stamp
from narwhal.lab import envfile, lifecycle, spec
from narwhal.lab.network import FABRIC_IF
from narwhal.lab.plan import LabPlan
from tests.fidelity.requests import SERVED_NAME
from tests.lab.installing import approved_checkout
from tests.lab.operator import lab_unavailable
from tests.real.engines import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN
from tests.real.prediction import assert_capture_is_predicted

pytestmark = pytest.mark.timeout(1500)

NARWHAL = str(Path(sys.executable).parent / "narwhal")
LAB = "nwr"
GATES = ("discover", "install", "engines", "fabric", "attest", "preflight", "serve")


def _spec(site: Path, model: Path) -> dict[str, Any]:
    def engine(index: int) -> dict[str, Any]:
        return {"name": f"eng{index}", "role": "engine", "hardware": {"accelerators": {
            "vendor": "NVIDIA", "product": "NVIDIA H100 80GB HBM3", "count": 1,
            "memory_mib": 81559, "devices": [{
                "pci_bus_id": f"00000000:{0x40 + index:02X}:00.0",
                "uuid": f"GPU-{index:08x}-0000-4a1b-8c2d-00000000000{index}"}]}},
                "disk_mib": 256, "cpus": [index - 1]}
    return stamp(spec.SCHEMA, spec.VERSION, {
        "name": LAB,
        "management": {"subnet": "10.217.0.0/24", "mtu": 1500},
        "fabric": {"subnet": "10.218.0.0/24", "mtu": 9000},
        "hosts": [{"name": "router", "role": "router"}, engine(1), engine(2)],
        "image": {"repository": "narwhal-lab/vllm-cpu", "tag": "v0.32.0",
                  "entrypoint": ["vllm", "serve"],
                  "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                  "vllm_site": str(site)},
        "model": {"name": SERVED_NAME, "dir": "/srv/models/tiny-llama", "source": str(model)},
    })


def _engine_env(core: int, fabric_ip: str) -> str:
    """One engine's environment: its own core, UCX over TCP on the fabric interface only.
    The hosts show NVIDIA device nodes (the lab's inventory), and NIXL then refuses a UCX_TLS
    without CUDA memory support; cuda_copy satisfies it and, with no CUDA driver, UCX loads
    no CUDA transport, so KV moves over TCP."""
    return json.dumps({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(core), "UCX_TLS": "tcp,self,cuda_copy",
        "UCX_NET_DEVICES": FABRIC_IF, "VLLM_HOST_IP": fabric_ip,
        "NARWHAL_NIXL_PTHR_DELAY_US": "1000", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1"}, separators=(",", ":"))


@dataclass
class Rehearsal:
    plan: LabPlan
    env: Path
    runs: Path
    checkout: Path
    wheels: Path
    deploy: dict[str, Any]
    deploy_code: int
    deploy_log: str

    def narwhal(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        argv = [NARWHAL, "lab", "exec", "--name", LAB, "--", NARWHAL, *args, "--env",
                str(self.env), "--runs", str(self.runs)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def attempt(self, gate: str) -> Path:
        doc = json.loads((self.runs / "rehearsal" / "ledger.json").read_text())
        return self.runs / "rehearsal" / gate / doc["gates"][gate]["last"]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def bring_up(real_python: Path, tiny_model: Path, work: Path) -> Rehearsal:
    """The rehearsal lab up, its `.env` written and its host keys trusted (nothing deployed)."""
    site = next((real_python.parent.parent / "lib").glob("python3.*/site-packages"))
    checkout, revision, wheels = approved_checkout(work)
    lab_spec = spec.validate(_spec(site, tiny_model), "rehearsal spec")
    lifecycle.down(LAB)
    plan = lifecycle.up(lab_spec)
    env = work / ".env"
    envfile.write(plan, env)
    args = json.dumps(["--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
                       "--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES),
                       "--attention-backend", "CPU_ATTN"], separators=(",", ":"))
    with env.open("a") as fh:
        fh.write(f"NARWHAL_DEPLOYMENT=rehearsal\nNARWHAL_DEPLOYMENT_REVISION={revision}\n"
                 f"NARWHAL_ENGINE_ARGS='{args}'\nNARWHAL_KV_BUFFER_DEVICE=cpu\n"
                 "NARWHAL_TTFT_S=5\nNARWHAL_TPOT_S=1\n"
                 "NARWHAL_WORKLOAD_PROMPT_TOKENS=256\n")
        for n, h in enumerate(plan.engines(), start=1):
            fh.write(f"NARWHAL_NODE_{n}_ENGINE_ENV='{_engine_env(n - 1, h.fabric_ip)}'\n")
    r = Rehearsal(plan, env, work / "runs", checkout, wheels, {}, -1, "")
    trusted = r.narwhal("hosts", "trust", "--yes")
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    return r


def deploy(r: Rehearsal) -> None:
    """`narwhal deploy` A to G from the workstation namespace, its JSON document kept."""
    done = r.narwhal("deploy", "--checkout", str(r.checkout), "--wheelhouse", str(r.wheels),
                     "--fabric-seconds", "2", "--json", timeout=1200)
    r.deploy_code, r.deploy_log = done.returncode, done.stderr
    try:
        r.deploy = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(done.stdout[-3000:] + done.stderr[-6000:]) from None


@pytest.fixture(scope="module")
def rehearsal(real_python: Path, tiny_model: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    try:
        r = bring_up(real_python, tiny_model, tmp_path_factory.mktemp("rehearsal"))
        deploy(r)
        yield r
    finally:
        lifecycle.down(LAB)


def test_deploy_runs_every_gate_on_real_vllm_engines(rehearsal: Rehearsal) -> None:
    r = rehearsal
    states = {row["gate"]: row["state"] for row in r.deploy.get("status", [])}
    assert r.deploy_code == 0, json.dumps(r.deploy, indent=1)[-6000:] + r.deploy_log[-4000:]
    assert all(states.get(g) == "passed" for g in GATES), states


def test_each_captured_cache_equals_the_prediction_for_its_launch_record(
        rehearsal: Rehearsal) -> None:
    attempt = rehearsal.attempt("engines")
    for n in (1, 2):
        engine = f"engine-{n}"
        layout = json.loads(next(attempt.rglob(f"cache-layout-{engine}.json")).read_text())
        record = json.loads(next(rehearsal.attempt("discover").rglob(
            f"launch-{engine}.json")).read_text())
        assert layout["version"].startswith("0.32")
        assert layout["started"]["runtime"] == "docker"
        assert_capture_is_predicted(layout, record, engine)


def _verdicts(evidence: dict[str, Any], gate: str) -> dict[str, str]:
    return {v["subject"]: v["status"] for v in evidence["verdicts"] if v["gate"] == gate}


def test_the_live_kv_contract_is_proven_on_both_ordered_pairs_over_the_fabric(
        rehearsal: Rehearsal) -> None:
    evidence = json.loads((rehearsal.attempt("preflight") / "check-full.json").read_text())
    pairs = {"engine-1->engine-2", "engine-2->engine-1"}
    assert _verdicts(evidence, "kv") == {p: "pass" for p in pairs}
    contract = _verdicts(evidence, "contract")
    assert set(contract) >= {"engine-1", "engine-2"} | pairs
    assert set(contract.values()) == {"pass"}
    # Each engine's side channel and UCX are on its own host's fabric address and interface,
    # and the hosts are separate network namespaces: no KV byte could take loopback.
    fabric = {f"engine-{n}": h.fabric_ip for n, h in enumerate(rehearsal.plan.engines(), 1)}
    for engine, address in fabric.items():
        record = json.loads(next(rehearsal.attempt("discover").rglob(
            f"launch-{engine}.json")).read_text())
        assert record["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == address
        assert record["kv_transfer_config"]["kv_buffer_device"] == "cpu"


def test_a_short_trial_through_the_tunnel_is_reconciled_with_the_journal(
        rehearsal: Rehearsal) -> None:
    done = rehearsal.narwhal("trial", "--rates", "1", "--requests", "8", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(done.stdout)
    [rate] = doc["rates"]
    rec = rate["reconciled"]
    assert rec["ok"] and rec["sent"] == rec["journalled"] == 8, rec
    assert rate["ok"] == 8 and rate["verdict"] == "within SLO", rate
