"""Every `.env` field does what it says: changing it changes something Narwhal generates or
runs (a launch record, the fleet, a role's files, a command line, Gate A's verdict, the KV
transfer path, a fabric budget), or the field is refused. A field that is only validated
and fingerprinted would let an operator edit it, see gates go stale, and change nothing.

The walk covers the whole vocabulary (deploy/inputs/vocabulary.py): a field added without an
entry in CHANGES fails `test_every_field_of_the_vocabulary_is_walked`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.core.kv import budget as kvb
from narwhal.core.launch_record import LaunchRecord
from narwhal.deploy.checkpoint.pin import hub_request
from narwhal.deploy.fabric.budget import payload_budget
from narwhal.deploy.gates import monitoring
from narwhal.deploy.gates.attest import sidecars_reached_at
from narwhal.deploy.gates.discover_checks import all_problems
from narwhal.deploy.gates.generated import fleet_draft, launch_record
from narwhal.deploy.gates.preflight import kv_canary
from narwhal.deploy.gates.serve import DEFAULT_ROUTER_URL, url_bind
from narwhal.deploy.gates.transfer import transfer_paths
from narwhal.deploy.hosts.sessions import known_hosts_path, physical_hosts
from narwhal.deploy.hosts.ssh import SshHost
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.inputs import vocabulary as v
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.package.prepared import remote_dir
from narwhal.deploy.package.rolefiles import role_files
from tests.envtext import valid_env

BASE = {"NARWHAL_FABRIC_INTERFACE": "fab0", "NARWHAL_NODE_1_IP": "10.20.0.11",
        "NARWHAL_NODE_2_IP": "10.20.0.12", "NARWHAL_TENSOR_PARALLEL_SIZE": "1",
        "NARWHAL_GPU_IDS": "0"}
RDMA = {"NARWHAL_TRANSFER_TRANSPORT": "ucx_rdma", "NARWHAL_TRANSFER_NET_DEVICES": "mlx5_0:1"}
SHARED_HOST = {"NARWHAL_NODE_2_SSH": "root@10.213.0.11", "NARWHAL_NODE_2_SSH_PASSWORD": None,
               "NARWHAL_NODE_2_IP": "10.20.0.11", "NARWHAL_NODE_2_ENGINE_PORT": "8001",
               "NARWHAL_NODE_2_ATTEST_PORT": "8011", "NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT": "5601",
               "NARWHAL_NODE_2_UCX_TCP_PORT_RANGE": "30200-30300"}
KEY = "k" * 24


def _q(value: str) -> str:
    return f"'{value}'"


REPO = {"MODEL_REPO_ID": "narwhal-lab/tiny-llama"}
# field -> (context set on both sides, value before (None: the base file's), value after). A field
# name here is its NARWHAL_<FIELD> form, or NARWHAL_NODE_1_<FIELD> for a per-engine override.
CHANGES: dict[str, tuple[dict[str, Any], str | None, str]] = {
    "ENGINE_IMAGE": ({}, None, "sha256:" + "ef" * 32),
    "ENGINE_MODEL_NAME": ({}, None, "Qwen/Qwen3-0.6B"),
    "MODEL_DIR": ({}, None, "/srv/models/other"),
    "RUN_DIR": ({}, None, "/srv/narwhal/other"),
    "FABRIC_INTERFACE": ({}, "fab0", "fab1"),
    "ENGINE_PORT": ({}, None, "8100"),
    "ATTEST_PORT": ({}, None, "8110"),
    "NIXL_SIDE_CHANNEL_PORT": ({}, None, "5700"),
    "KV_EVENTS_PORT": ({}, None, "5557"),
    "UCX_TCP_PORT_RANGE": ({}, None, "31000-31100"),
    "GPU_IDS": ({}, "0", "1"),
    "TENSOR_PARALLEL_SIZE": ({"NARWHAL_GPU_IDS": "0,1"}, "1", "2"),
    "MODEL_DTYPE": ({}, None, "float16"),
    "BLOCK_SIZE": ({}, None, "64"),
    "ENGINE_ARGS": ({}, None, _q('["--max-num-seqs","8"]')),
    "ENGINE_ENV": ({}, None, _q('{"VLLM_ATTENTION_BACKEND":"FLASH_ATTN"}')),
    "TRANSFER_TRANSPORT": ({"NARWHAL_TRANSFER_NET_DEVICES": "mlx5_0:1"}, None, "ucx_rdma"),
    "TRANSFER_NET_DEVICES": (RDMA, "mlx5_0:1", "mlx5_1:1"),
    "TRANSFER_DEVICES": (RDMA, None, _q('["mlx5_0","mlx5_1"]')),
    "GPU_TLS": ({}, None, "cuda"),
    "KV_BUFFER_DEVICE": ({}, None, "cpu"),
    "MODEL_CONFIG_SHA256": ({}, None, "22" * 32),
    "GPU_MEMORY_UTILIZATION": ({}, None, "0.8"),
    "NODE_1_SSH": ({}, "root@10.213.0.11", "ops@10.213.0.11"),
    "NODE_1_SSH_PASSWORD": ({}, None, "another-password"),
    "NODE_1_SSH_KEY": ({}, None, "/root/.ssh/other_key"),
    "NODE_1_IP": ({}, "10.20.0.11", "10.20.0.21"),
    "NODE_1_URL": ({}, None, "http://engine-1.fleet:8000"),
    "NODE_1_ATTESTATION_URL": ({}, None, "http://engine-1.fleet:8010/v1/attestation"),
    "DEPLOYMENT": ({}, None, "other"),
    "DEPLOYMENT_REVISION": ({}, None, "fedcba9876543210fedcba9876543210fedcba98"),
    "ROUTER_SSH": ({}, None, "root@10.213.0.20"),
    "ROUTER_SSH_PASSWORD": ({}, None, "router-password"),
    "ROUTER_SSH_KEY": ({}, None, "/root/.ssh/router_key"),
    "ROUTER_URL": ({}, None, "http://127.0.0.1:8080"),
    "ROUTER_STANDBY_URL": ({}, None, "http://127.0.0.1:8081"),
    "ROUTER_API_KEY": ({}, None, "r" * 24),
    "SSH_KEY": ({}, None, "/root/.ssh/fleet_key"),
    "SSH_KNOWN_HOSTS": ({}, None, "/root/.narwhal/known_hosts"),
    "SSH_CONNECT_TIMEOUT": ({}, None, "30"),
    "TTFT_S": ({}, None, "2.5"),
    "TPOT_S": ({}, None, "0.05"),
    "ENGINE_KEY": ({}, KEY, "e" * 24),
    "HF_TOKEN": ({}, None, "hf_" + "h" * 30),
    "GRAFANA_BIND_ADDRESS": ({}, None, "10.0.0.5"),
    "PROMETHEUS_LISTEN_ADDRESS": ({}, None, "127.0.0.1:9191"),
    "SHARED_GPU_ALLOWANCE": (SHARED_HOST, None, "true"),
    "KV_CANARY_INTERVAL_S": ({}, None, "3"),
    "WORKLOAD_PROMPT_TOKENS": ({}, None, "4096"),
    "WORKLOAD_HANDOFFS_PER_S": ({}, None, "20"),
    "WORKLOAD_BURST": ({}, None, "8"),
    "WORKLOAD_TRANSFER_BUDGET_MS": ({}, None, "250"),
    "WORKLOAD_HEADROOM": ({}, None, "2"),
    "MODEL_REPO_ID": ({}, None, "Qwen/Qwen3-0.6B"),
    "MODEL_REVISION": (REPO, None, "v1.0"),
    "HF_ENDPOINT": (REPO, None, "http://10.0.0.5:8600"),
}
REFUSED = sorted(v.NOT_YET)


def _name(field: str) -> str:
    return field if field in v.OTHER_KNOWN or field in v.NOT_YET else f"NARWHAL_{field}"


def _gpu(k: int, host: int) -> dict[str, Any]:
    return {"index": k, "name": "NVIDIA H200", "uuid": f"GPU-{host:08x}-0000-4000-8000-{k:012x}",
            "pci_bus_id": f"0000:{host:02x}:{k:02x}.0", "memory_total_mib": 143771,
            "numa_node": 0}


def _facts(inputs: Inputs, alias: str, roles: list[str], n: int) -> dict[str, Any]:
    """What Gate A would find on a host made as the inputs describe it."""
    engines = [e for e in inputs.engines if e.role in roles]
    if not engines:
        return {"python": {"version": "3.11.7", "has_venv": True}}
    e = engines[0]
    return {
        "hostname": alias, "python": {"version": "3.11.7", "has_venv": True},
        "tools": {t: {"path": f"/usr/bin/{t}", "version": "1"} for t in ("git", "make", "curl")},
        "accelerators": {"vendor": "nvidia", "gpus": [_gpu(k, n) for k in range(2)],
                         "driver_version": "570", "error": None},
        "interfaces": [{"name": e.fabric_interface, "mtu": 9000}],
        "fabric_interface": {"name": e.fabric_interface, "mtu": 9000, "operstate": "UP",
                             "addresses": [{"family": "inet", "address": e.ip,
                                            "prefixlen": 24, "scope": "global"}]},
        "listeners": [],
        "disk": {x.run_dir: {"exists": True, "is_dir": True, "writable": True,
                             "free_bytes": 10**10} for x in engines},
        "image": {"ref": e.engine_image, "id": e.engine_image, "repo_digests": [],
                  "found": True, "error": None, "packages": {}},
        "model": {"dir": e.model_dir, "exists": True, "model_tree_sha256": "ab" * 32,
                  "config_sha256": "11" * 32, "rows": [["config.json", 10, "11" * 32]],
                  "error": None},
    }


def _ssh(inputs: Inputs, tmp: Path) -> list[Any]:
    out = []
    for h in physical_hosts(inputs):
        host = SshHost(h.alias, h.destination, known_hosts=known_hosts_path(inputs, tmp),
                       control_dir=tmp, key=h.key, password=h.password,
                       connect_timeout=inputs.connect_timeout_s)
        out.append([h.alias, h.destination.text, *host._options(),
                    h.password.reveal() if h.password else None])
    return out


def _gate_a(inputs: Inputs) -> dict[str, Any]:
    hosts = physical_hosts(inputs)
    host_of = {role: h.alias for h in hosts for role in h.roles if role != "router"}
    facts = {h.alias: _facts(inputs, h.alias, h.roles, n) for n, h in enumerate(hosts, 1)}
    problems, plans = all_problems(inputs, facts, host_of)
    if problems:
        return {"gate A": sorted(p.line() for p in problems)}
    records = {p.engine.role: launch_record(inputs, p) for p in plans}
    try:
        paths: Any = {role: p.model_dump(mode="json") for role, p in transfer_paths(
            inputs, [(role, host_of[role], LaunchRecord.model_validate_json(json.dumps(r)))
                     for role, r in records.items()]).items()}
    except InputError as exc:
        paths = [p.line() for p in exc.problems]
    return {"launch records": records, "fleet": fleet_draft(inputs, plans),
            "transfer paths": paths}


def artifacts(text: str, tmp: Path) -> dict[str, Any]:
    """What Narwhal generates or runs from one `.env`, computed without a host."""
    env = tmp / ".env"
    env.write_text(text)
    try:
        inputs = parse_inputs(text, env)
    except InputError as exc:
        return {"refused": [p.line() for p in exc.problems]}
    files = role_files(inputs, [r for h in physical_hosts(inputs) for r in h.roles])
    listen = inputs.prometheus_listen_address or "127.0.0.1:9090"
    return {
        **_gate_a(inputs),
        "role files": {r: (f.env_text, f.secrets) for r, f in files.items()},
        "ssh": _ssh(inputs, tmp),
        "remote dir": remote_dir(inputs.deployment, inputs.revision),
        "router": [url_bind(inputs.router.url or DEFAULT_ROUTER_URL),
                   inputs.router.standby_url and url_bind(inputs.router.standby_url)],
        "prometheus": [f"--web.listen-address={listen}", monitoring.reached_at(listen)],
        "grafana": monitoring.grafana_server_ini(inputs.grafana_bind_address),
        "sidecars": sidecars_reached_at(inputs),
        "kv canary": kv_canary(inputs.kv_canary_interval_s),  # Gate F's calibrated fleet
        "hub": hub_request(inputs.checkpoint),  # what Gate A asks the hub to pin
        "budget": payload_budget(kvb.uniform_payload(4096, inputs.workload.prompt_tokens, 16),
                                 inputs.workload).required_gbps,
    }


def _env(context: dict[str, Any], field: str, value: str | None) -> str:
    values: dict[str, str | None] = {"NARWHAL_ENGINE_KEY": KEY, **BASE, **context}
    if value is not None:  # None: as the base file has it (set or unset)
        values[_name(field)] = value
    return valid_env(**values)


def test_every_field_of_the_vocabulary_is_walked() -> None:
    fields = {*v.ENGINE_FIELDS, *v.GLOBAL_ONLY, *(f"NODE_1_{n}" for n in v.NODE_ONLY),
              *(n.removeprefix("NARWHAL_") for n in v.OPTIONAL_TYPED),
              *(n.removeprefix("NARWHAL_") for n in v.WORKLOAD_TYPED), *v.OTHER_KNOWN}
    assert fields - set(CHANGES) == set(), "a field without a walk entry"
    assert set(CHANGES) - fields == set(), "a walk entry for a field that does not exist"


def test_the_walks_base_file_passes_gate_a_with_a_launch_record_per_engine(
        tmp_path: Path) -> None:
    got = artifacts(_env({}, "ENGINE_IMAGE", None), tmp_path)
    assert set(got["launch records"]) == {"engine-1", "engine-2"}, got.get("gate A")


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_changing_a_field_changes_what_narwhal_generates_or_runs(
        field: str, tmp_path: Path) -> None:
    context, before, after = CHANGES[field]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    was = artifacts(_env(context, field, before), tmp_path / "a")
    now = artifacts(_env(context, field, after), tmp_path / "b")
    assert "refused" not in was or "refused" not in now, (was, now)
    differs = sorted(k for k in set(was) | set(now)
                     if json.dumps(was.get(k), sort_keys=True, default=str)
                     != json.dumps(now.get(k), sort_keys=True, default=str))
    assert differs, f"{_name(field)}: {before!r} -> {after!r} changed nothing Narwhal makes"


def test_no_field_of_the_vocabulary_is_waiting_for_something_to_act_on_it() -> None:
    assert REFUSED == []

