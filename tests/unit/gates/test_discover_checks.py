"""Gate A's relations on plain facts: every bad allocation names the host, the field and a fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from narwhal.deploy.gates.discover_checks import all_problems
from narwhal.deploy.inputs import parse_inputs
from tests.envtext import valid_env

IMAGE_ID = "sha256:" + "cd" * 32
TREE = "ab" * 32
ROWS = [["config.json", 10, "11" * 32], ["tokenizer_config.json", 20, "22" * 32]]


def _gpu(k: int, host: int) -> dict[str, Any]:
    return {"index": k, "name": "NVIDIA H200", "uuid": f"GPU-{host:08x}-0000-4000-8000-{k:012x}",
            "pci_bus_id": f"0000:{host:02x}:{k:02x}.0", "memory_total_mib": 143771,
            "numa_node": 0}


def _facts(host: int, ip: str) -> dict[str, Any]:
    return {
        "hostname": f"eng{host}", "python": {"version": "3.11.7", "has_venv": True},
        "tools": {t: {"path": f"/usr/bin/{t}", "version": "1"} for t in ("git", "make", "curl")},
        "accelerators": {"vendor": "nvidia", "gpus": [_gpu(k, host) for k in range(2)],
                         "driver_version": "570", "error": None},
        "interfaces": [{"name": "fab0", "mtu": 9000}],
        "fabric_interface": {"name": "fab0", "mtu": 9000, "operstate": "UP", "addresses": [
            {"family": "inet", "address": ip, "prefixlen": 24, "scope": "global"}]},
        "listeners": [],
        "disk": {"/srv/narwhal/run": {"exists": True, "is_dir": True, "writable": True,
                                      "free_bytes": 10**10}},
        "image": {"ref": "x", "id": IMAGE_ID, "repo_digests": [], "found": True, "error": None,
                  "packages": {}},
        "model": {"dir": "/srv/models/qwen", "exists": True, "model_tree_sha256": TREE,
                  "config_sha256": "11" * 32, "rows": copy.deepcopy(ROWS), "error": None},
    }


def _run(env: str, mutate: Any = None) -> list[str]:
    inputs = parse_inputs(env, Path(".env"))
    facts = {"node-1": _facts(1, "10.20.0.11"), "node-2": _facts(2, "10.20.0.12"),
             "router": {"python": {"version": "3.11.7", "has_venv": True}}}
    if mutate is not None:
        mutate(facts)
    host_of = {"engine-1": "node-1", "engine-2": "node-2"}
    problems, _ = all_problems(inputs, facts, host_of)
    return [p.line() for p in problems]


BASE = dict(NARWHAL_FABRIC_INTERFACE="fab0", NARWHAL_NODE_1_IP="10.20.0.11",
            NARWHAL_NODE_2_IP="10.20.0.12")


def test_matching_facts_pass_and_plan_every_engine() -> None:
    inputs = parse_inputs(valid_env(**BASE), Path(".env"))
    facts = {"node-1": _facts(1, "10.20.0.11"), "node-2": _facts(2, "10.20.0.12")}
    problems, plans = all_problems(inputs, facts, {"engine-1": "node-1", "engine-2": "node-2"})
    assert problems == []
    assert [p.as_json()["gpus"][0]["uuid"] for p in plans] == [
        "GPU-00000001-0000-4000-8000-000000000000", "GPU-00000002-0000-4000-8000-000000000000"]
    assert plans[0].tensor_parallel_size == 2 and plans[1].fabric_address == "10.20.0.12"


def _set(path: list[Any], value: Any, host: str = "node-2") -> Any:
    def mutate(facts: dict[str, Any]) -> None:
        node = facts[host]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return mutate


CASES: list[tuple[str, dict[str, str], Any, str]] = [
    ("changed checkpoint byte", {}, lambda f: (
        f["node-2"]["model"].update(model_tree_sha256="ff" * 32),
        f["node-2"]["model"]["rows"][1].__setitem__(2, "99" * 32)),
     "node-2: NARWHAL_NODE_2_MODEL_DIR: checkpoint differs from node-1's: first differing "
     "file tokenizer_config.json"),
    ("nvidia-smi without driver", {}, _set(["accelerators"], {
        "vendor": None, "gpus": [], "driver_version": None,
        "error": "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate "
                 "with the NVIDIA driver."}),
     "node-2: accelerators: GPU inspection failed: nvidia-smi exited 9"),
    ("GPU ids that do not exist", {"NARWHAL_NODE_2_GPU_IDS": "0,5"}, None,
     "node-2: NARWHAL_NODE_2_GPU_IDS: GPU(s) 5 do not exist on this host"),
    ("TP larger than GPUs", {"NARWHAL_NODE_2_TENSOR_PARALLEL_SIZE": "4"}, None,
     "node-2: NARWHAL_NODE_2_TENSOR_PARALLEL_SIZE: TP 4 is larger than the 2 GPU(s)"),
    ("mixed products", {}, lambda f: [g.update(name="NVIDIA H100")
                                      for g in f["node-2"]["accelerators"]["gpus"]],
     "engines: mixed GPU products"),
    ("image missing on one host", {}, _set(["image"], {"found": False, "error": "No such image"}),
     "node-2: NARWHAL_NODE_2_ENGINE_IMAGE: image"),
    ("image differs", {}, _set(["image", "id"], "sha256:" + "ee" * 32),
     "node-2: NARWHAL_NODE_2_ENGINE_IMAGE: image id sha256:eeee"),
    ("fabric interface missing", {}, _set(["fabric_interface"], None),
     "node-2: NARWHAL_NODE_2_FABRIC_INTERFACE: interface 'fab0' does not exist"),
    ("IP not on the interface", {"NARWHAL_NODE_2_IP": "10.20.0.99"}, None,
     "node-2: NARWHAL_NODE_2_IP: 10.20.0.99 is not an address of fab0"),
    ("port already listening", {}, _set(["listeners"], [
        {"port": 8000, "address": "0.0.0.0", "process": "nginx", "pid": 4242}]),
     "node-2: NARWHAL_NODE_2_ENGINE_PORT: port 8000 is already listening on 0.0.0.0, owned by "
     "nginx (pid 4242)"),
    ("run dir missing", {}, _set(["disk", "/srv/narwhal/run"], {"exists": False}),
     "node-2: NARWHAL_NODE_2_RUN_DIR: /srv/narwhal/run does not exist"),
    ("Python 3.10", {}, _set(["python", "version"], "3.10.12"),
     "node-2: python3: Python 3.10.12 (needs 3.11 or newer)"),
    ("git missing", {}, _set(["tools", "git"], {"path": None, "version": None}),
     "node-2: git: git is not installed"),
    ("model dir missing", {}, _set(["model"], {"exists": False}),
     "node-2: NARWHAL_NODE_2_MODEL_DIR: /srv/models/qwen does not exist"),
    ("config pin differs", {"NARWHAL_MODEL_CONFIG_SHA256": "33" * 32}, None,
     "NARWHAL_NODE_1_MODEL_CONFIG_SHA256: config.json has sha256"),
    ("engine shapes differ", {"NARWHAL_NODE_2_GPU_IDS": "0"}, None,
     "engines: engines differ in shape"),
]


@pytest.mark.parametrize(("case", "env", "mutate", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_deployment_names_the_host_the_field_and_a_fix(
        case: str, env: dict[str, str], mutate: Any, expected: str) -> None:
    lines = _run(valid_env(**{**BASE, **env}), mutate)
    assert any(expected in line for line in lines), lines
    assert all("; " in line for line in lines)  # every problem carries its fix


@pytest.mark.parametrize("allowance", [None, "true"])
def test_colocated_engines_share_a_gpu_only_with_the_allowance(allowance: str | None) -> None:
    env = valid_env(**{**BASE, "NARWHAL_SHARED_GPU_ALLOWANCE": allowance,
                       "NARWHAL_NODE_2_SSH": "root@10.213.0.11",
                       "NARWHAL_NODE_2_SSH_PASSWORD": None, "NARWHAL_NODE_1_GPU_IDS": "0",
                       "NARWHAL_NODE_2_GPU_IDS": "GPU-00000001-0000-4000-8000-000000000000", "NARWHAL_NODE_2_IP": "10.20.0.11",
                       "NARWHAL_NODE_2_ENGINE_PORT": "8001", "NARWHAL_NODE_2_ATTEST_PORT": "8011",
                       "NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT": "5601"})
    inputs = parse_inputs(env, Path(".env"))
    facts = {"node-1": _facts(1, "10.20.0.11")}
    problems, _ = all_problems(inputs, facts, {"engine-1": "node-1", "engine-2": "node-1"})
    shared = [p for p in problems if "is also allocated to engine-1" in p.line()]
    assert bool(shared) == (allowance is None), problems


def test_a_host_that_could_not_be_inspected_gets_the_fix_for_its_cause() -> None:
    from narwhal.core.errors import ContractError, HostKeyChanged, HostUnreachable
    from narwhal.deploy.gates.discover import _host_error

    no_python = _host_error("node-2", ContractError("node-2: python3 is not installed (the "
                                                    "probe needs it)"))
    assert no_python.field == "node-2: probe" and "install python3" in no_python.fix
    rekeyed = _host_error("node-3", HostKeyChanged("node-3", "SHA256:old", "SHA256:new"))
    assert rekeyed.field == "node-3: ssh" and "--replace node-3" in rekeyed.fix
    down = _host_error("node-1", HostUnreachable("node-1", "no route"))
    assert "reachable over SSH" in down.fix


def _workstation(sshpass: str | None) -> dict[str, Any]:
    return {"hostname": "ws", "python": {"version": "3.11.7", "has_venv": True},
            "tools": {"sshpass": {"path": sshpass, "version": "1.09" if sshpass else None}}}


def _workstation_lines(env: dict[str, str | None], sshpass: str | None) -> list[str]:
    inputs = parse_inputs(valid_env(**{**BASE, **env}), Path(".env"))
    facts = {"node-1": _facts(1, "10.20.0.11"), "node-2": _facts(2, "10.20.0.12")}
    problems, _ = all_problems(inputs, facts, {"engine-1": "node-1", "engine-2": "node-2"},
                               workstation=_workstation(sshpass))
    return [p.line() for p in problems]


def test_password_ssh_without_sshpass_on_the_workstation_blocks_naming_the_variables() -> None:
    """Every password login goes through sshpass on the workstation; without it each one fails
    to connect, so Gate A says so once, naming the variables that need it and the way out."""
    lines = _workstation_lines({"NARWHAL_ROUTER_SSH_PASSWORD": "router-horse-battery"}, None)
    assert lines == ["workstation: NARWHAL_NODE_2_SSH_PASSWORD, NARWHAL_ROUTER_SSH_PASSWORD: "
                     "sshpass is not installed, and password SSH needs it; apt-get install "
                     "sshpass, or use key auth (NARWHAL_SSH_KEY) instead of the password(s)"]


@pytest.mark.parametrize(("env", "sshpass"), [
    ({}, "/usr/bin/sshpass"),  # a password login, and sshpass to make it
    ({"NARWHAL_NODE_2_SSH_PASSWORD": None}, None),  # keys only: sshpass is not needed
])
def test_sshpass_is_asked_of_the_workstation_only_where_a_password_needs_it(
        env: dict[str, str | None], sshpass: str | None) -> None:
    assert _workstation_lines(env, sshpass) == []


def test_a_missing_ssh_client_tool_is_a_named_host_problem_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: Popen's FileNotFoundError escaped Gate A as a traceback."""
    from narwhal.core.errors import HostError
    from narwhal.core.secret import Secret
    from narwhal.deploy.gates.discover import _host_error
    from narwhal.deploy.hosts.ssh import SshHost
    from narwhal.deploy.inputs.destination import parse_destination

    monkeypatch.setenv("PATH", str(tmp_path))  # no sshpass (and no ssh) on PATH
    host = SshHost("node-2", parse_destination("ops@10.213.0.12"), known_hosts=tmp_path / "kh",
                   control_dir=tmp_path, password=Secret("pw", "NARWHAL_NODE_2_SSH_PASSWORD"))
    with pytest.raises(HostError) as caught:
        host.run(["true"])
    problem = _host_error("node-2", caught.value)
    assert problem.line() == (
        "node-2: ssh: node-2: sshpass is not installed on the workstation "
        "(NARWHAL_NODE_2_SSH_PASSWORD needs it); apt-get install sshpass, or use key auth "
        "(NARWHAL_SSH_KEY) instead of the password(s)")
