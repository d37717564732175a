"""Gate C on the lab, driven from the workstation namespace as an operator runs it.

The engines come up only through the product: `narwhal engines` runs the installed
`narwhal-engine` on each host over SSH, which runs the image through the host's docker (the
lab's double, whose image `vllm` is the engine emulator). Each test ends with the hosts'
containers removed, so the next starts on free ports.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.lab.installing import Installer, rows

from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.vllm_args import launch_plan_from_args
from narwhal.core.launch_record import LaunchRecord
from narwhal.lab.engine.testing import TINY_QWEN3_NEXT, write_model_dir
from narwhal.lab.faults import Faults
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]


def _engines(installer: Installer, env: Path | None = None) -> tuple[int, dict[str, Any]]:
    return installer.op.json_command("engines", env=env)


def _clear_containers(plan: LabPlan) -> None:
    for h in plan.engines():
        ssh(plan, h.name, "docker ps -aq | xargs -r docker rm -f >/dev/null")


@pytest.fixture
def installed(installer: Installer) -> Iterator[Installer]:
    done = installer.install()
    assert done.returncode == 0, done.stdout + done.stderr
    _clear_containers(installer.op.plan)
    try:
        yield installer
    finally:
        _clear_containers(installer.op.plan)


def _spans(attempt: Path, sub: str) -> list[tuple[datetime, datetime, str]]:
    return [(datetime.fromisoformat(r["start"].replace("Z", "+00:00")),
             datetime.fromisoformat(r["end"].replace("Z", "+00:00")), r["host"])
            for r in rows(attempt) if r["argv"][0].endswith("/narwhal-engine")
            and r["argv"][1] == sub]


def test_engines_start_through_the_hosts_docker_and_match_core_kv(installed: Installer) -> None:
    code, doc = _engines(installed)
    assert code == 0 and doc["verdict"] == "passed", doc
    attempt = installed.op.last_attempt("engines")
    discover = installed.op.last_attempt("discover")
    for n in (1, 2, 3):
        role = f"engine-{n}"
        cap = json.loads((attempt / f"cache-layout-{role}.json").read_text())
        record = LaunchRecord.model_validate_json((discover / f"launch-{role}.json").read_text())
        geometry = plan_geometry(cap["checkpoint_config"], launch_plan_from_args(
            [record.model_dir, *record.vllm_args], name=role, vllm_version=cap["version"],
            environment=record.environment))
        assert [r["compatibility_hash"] for r in cap["ranks"]] == [
            geometry.compatibility_hash] * record.tensor_parallel_size  # every rank answered
        assert cap["version"] and record.served_model_name in cap["models"]
        assert cap["process_start_time_seconds"] > 0 and cap["completion"]["text"]
        assert cap["started"]["runtime"] == "docker" and len(cap["started"]["id"]) == 64
        _assert_engine_evidence(attempt, role, cap)
    starts = _spans(attempt, "start")
    assert sorted(h for _, _, h in starts) == ["node-1", "node-2", "node-3"]
    first_end = min(end for _, end, _ in starts)
    assert all(start < first_end for start, _, _ in starts), starts  # disjoint GPUs: at once
    runs = [r for r in rows(attempt) if r["argv"][:2] == ["docker", "run"]]
    assert sorted(r["host"] for r in runs) == ["node-1", "node-2", "node-3"]  # as reported
    assert all(r["transport"] == "reported" and r["exit_status"] == 0 for r in runs)
    # Each host's `docker run` ran inside its `narwhal-engine start`, and those overlap (above).
    # (The runs themselves last 0.1-0.3 s, so whether they overlap each other is jitter.)
    span = {h: (start, end) for start, end, h in starts}
    for r in runs:
        began, ended = span[r["host"]]
        assert began <= datetime.fromisoformat(r["start"].replace("Z", "+00:00")) and \
            datetime.fromisoformat(r["end"].replace("Z", "+00:00")) <= ended, (r, began, ended)
    for h in installed.op.plan.engines():
        ps = ssh(installed.op.plan, h.name, "docker ps --format '{{.Names}}'").stdout.split()
        assert len(ps) == 1 and ps[0].startswith("narwhal-engine-")


def _assert_engine_evidence(attempt: Path, role: str, cap: dict[str, Any]) -> None:
    """The engine's log (the container's, through the host's docker) and the capture's HTTP
    exchanges are artifacts of the attempt: listed with their sha256, 0600, holding what
    they say; the completion's bytes are the ones the capture parsed."""
    listed = json.loads((attempt / "attempt.json").read_text())["artifacts"]
    for name in (f"engine-log-{role}.txt", f"http-{role}.json"):
        data = (attempt / name).read_bytes()
        assert listed[name] == hashlib.sha256(data).hexdigest(), name
        assert (attempt / name).stat().st_mode & 0o777 == 0o600, name
    log = (attempt / f"engine-log-{role}.txt").read_text()
    assert log.startswith(f"# narwhal: {role}'s engine log from docker logs "
                          f"{cap['started']['id']}: the whole log"), log[:200]
    assert "Starting vLLM API server" in log
    exchanges = {x["what"]: x for x in json.loads(
        (attempt / f"http-{role}.json").read_text())["exchanges"]}
    assert list(exchanges) == ["version", "models", "metrics", "completion"]
    assert all(x["response"]["status"] == 200 for x in exchanges.values()), exchanges
    reply = json.loads(exchanges["completion"]["response"]["body"]["text"])
    assert reply["choices"][0]["text"] == cap["completion"]["text"]
    assert all("Authorization" not in x["request"]["headers"] for x in exchanges.values())


def test_a_port_already_listening_blocks_before_any_container(installed: Installer) -> None:
    plan = installed.op.plan
    host = plan.engines()[0].name
    started = ssh(plan, host, "setsid -f python3 -m http.server 8000 --bind 0.0.0.0 "
                  ">/dev/null 2>&1 </dev/null; sleep 1; pgrep -f '[h]ttp.server 8000'")
    pid = started.stdout.split()[0]
    try:
        code, doc = _engines(installed)
        assert code != 0 and doc["verdict"] == "blocked", doc
        assert any(p["field"] == "node-1: engine-1: ports" and "8000" in p["problem"]
                   and "python3" in p["problem"] for p in doc["problems"]), doc["problems"]
        for h in plan.engines():
            assert ssh(plan, h.name, "docker ps -aq").stdout.strip() == ""
        assert _spans(installed.op.last_attempt("engines"), "start") == []
    finally:
        ssh(plan, host, f"kill {pid}")


def test_a_plan_edited_after_check_is_refused_by_start(installed: Installer) -> None:
    plan = installed.op.plan
    host = plan.engines()[1].name
    install = json.loads((installed.op.last_attempt("install") / "plan.json").read_text())
    base = installed.remote
    tool = f"{base}/venv/bin/narwhal-engine"
    launch = f"{base}/runs/{install['prepared_run']}/launch/engine-2.json"
    run_dir = "/srv/narwhal-run/engine-2-edited"
    script = (f"{tool} prepare --launch {launch} --run-dir {run_dir} >/dev/null && "
              f"{tool} check --run-dir {run_dir} >/dev/null && "
              f"sed -i 's/--block-size/--block-size/; s/\"engine-2\"/\"engine-2\" /' "
              f"{run_dir}/launch.json && {tool} start --run-dir {run_dir}")
    done = ssh(plan, host, script)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("NARWHAL_RESULT "))
    result = json.loads(line.split(" ", 1)[1])
    assert not result["ok"] and "plan edited" in result["error"]
    assert ssh(plan, host, "docker ps -aq").stdout.strip() == ""


def test_a_missing_device_node_and_a_changed_checkpoint_block_naming_host_and_engine(
        installed: Installer) -> None:
    plan = installed.op.plan
    eng1, eng3 = plan.engines()[0].name, plan.engines()[2].name
    tokenizer = f"{plan.spec.model.dir}/tokenizer_config.json"
    ssh(plan, eng1, "mv /dev/nvidia1 /dev/nvidia1.away")
    original = ssh(plan, eng3, f"cat {tokenizer}").stdout
    ssh(plan, eng3, f"printf ' ' >> {tokenizer}")
    try:
        code, doc = _engines(installed)
        assert code != 0 and doc["verdict"] == "blocked", doc
        fields = {p["field"]: p for p in doc["problems"]}
        assert "/dev/nvidia1 is missing" in fields["node-1: engine-1: gpu 1"]["problem"]
        changed = fields["node-3: engine-3: checkpoint"]
        assert "model_tree_sha256" in changed["problem"] and changed["fix"]
        assert "node-2: engine-2: checkpoint" not in fields
        for h in plan.engines():
            assert ssh(plan, h.name, "docker ps -aq").stdout.strip() == ""
    finally:
        ssh(plan, eng1, "mv /dev/nvidia1.away /dev/nvidia1")
        ssh(plan, eng3, f"cat > {tokenizer} <<'EOF'\n{original}EOF")


def test_a_block_size_mismatch_fails_the_contract_and_recover_removes_only_its_containers(
        installed: Installer) -> None:
    plan, op = installed.op.plan, installed.op
    env = op.variant("block16", NARWHAL_NODE_2_BLOCK_SIZE="16")
    try:
        assert op.discover(env=env)[0] == 0
        done = installed.install(env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        code, doc = _engines(installed, env=env)
        assert code != 0 and doc["verdict"] == "blocked", doc
        found = [p for p in doc["problems"] if "block_size" in p["field"]]
        # engine-2's 16-token blocks cannot take engine-1's 128-token ones (the reverse
        # divides evenly); the finding names both engines and the factor.
        assert any(p["field"] == "engine-1 -> engine-2: block_size" for p in found), found
        assert all("16" in p["problem"] and p["fix"] for p in found)
        # The operator replaces engine-3's container by hand: recovery must leave that one.
        eng3 = plan.engines()[2].name
        ssh(plan, eng3, "docker rm -f narwhal-engine-3 >/dev/null && docker run -d --name "
            "narwhal-engine-3 --network host --entrypoint sleep "
            f"{plan.spec.image.repository}:{plan.spec.image.tag} 300 >/dev/null")
        mine = ssh(plan, eng3, "docker ps -q --no-trunc").stdout.strip()
        recovered = op.narwhal("recover", "engines", env=env)
        assert recovered.returncode == 0, recovered.stderr
        for h in plan.engines()[:2]:
            assert ssh(plan, h.name, "docker ps -aq").stdout.strip() == ""
        assert ssh(plan, eng3, "docker ps -q --no-trunc").stdout.strip() == mine
        assert "kept" in recovered.stdout
    finally:
        _clear_containers(plan)
        again = op.discover()  # Gate A as the .env says again
        assert again[0] == 0, again


def _role_span(attempt: Path, role: str) -> tuple[datetime, datetime]:
    """From the engine's `start` command to the end of its `capture` (start to healthy)."""
    mine = [r for r in rows(attempt) if r["argv"][0].endswith("/narwhal-engine")
            and r["argv"][1] in ("start", "capture") and r["argv"][3].endswith(f"/{role}")]
    times = [datetime.fromisoformat(r[k].replace("Z", "+00:00")) for r in mine
             for k in ("start", "end")]
    return min(times), max(times)


def test_engines_sharing_a_gpu_start_one_after_another_and_the_rest_at_once(
        installed: Installer) -> None:
    plan, op = installed.op.plan, installed.op
    eng1 = plan.engines()[0]
    assert eng1.host.hardware is not None
    node1_ssh = next(ln.split("=", 1)[1] for ln in op.env.read_text().splitlines()
                     if ln.startswith("NARWHAL_NODE_1_SSH="))
    env = op.variant(
        "shared", NARWHAL_SHARED_GPU_ALLOWANCE="true", NARWHAL_NODE_2_SSH=node1_ssh,
        NARWHAL_NODE_2_IP=eng1.fabric_ip, NARWHAL_NODE_1_GPU_IDS="0",
        NARWHAL_NODE_2_GPU_IDS=eng1.host.hardware.accelerators.devices[0].uuid,
        NARWHAL_NODE_3_GPU_IDS="0", NARWHAL_NODE_2_ENGINE_PORT="8001",
        NARWHAL_NODE_2_ATTEST_PORT="8011", NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT="5601",
            NARWHAL_NODE_2_KV_EVENTS_PORT="5558",
        **{f"NARWHAL_NODE_{n}_TENSOR_PARALLEL_SIZE": "1" for n in (1, 2, 3)})
    try:
        code, doc = op.discover(env=env)
        assert code == 0, doc
        done = installed.install(env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        code, doc = _engines(installed, env=env)
        assert code == 0 and doc["verdict"] == "passed", doc
        attempt = op.last_attempt("engines")
        groups = json.loads((attempt / "plan.json").read_text())["start_groups"]
        assert sorted(map(sorted, groups)) == [["engine-1", "engine-2"], ["engine-3"]]
        one, two, three = (_role_span(attempt, f"engine-{n}") for n in (1, 2, 3))
        first, second = sorted([one, two])
        assert first[1] <= second[0], (one, two)  # one GPU: one after the other
        assert three[0] < first[1]  # a disjoint GPU: at the same time
    finally:
        _clear_containers(plan)
        again = op.discover()
        assert again[0] == 0, again


def test_an_image_that_differs_from_gate_as_blocks_naming_the_host(installed: Installer,
                                                                  faults: Faults) -> None:
    plan = installed.op.plan
    faults.image(plan.engines()[1].name)  # engine-2's host pulled a moved tag after Gate A
    code, doc = _engines(installed)
    assert code != 0 and doc["verdict"] == "blocked", doc
    image = [p for p in doc["problems"] if p["field"] == "node-2: engine-2: image"]
    assert image and "load the pinned image" in image[0]["fix"], doc["problems"]
    assert [p for p in doc["problems"] if p["field"].endswith(": image")] == image
    for h in plan.engines():
        assert ssh(plan, h.name, "docker ps -aq").stdout.strip() == ""


HYBRID_CONFIG = {**TINY_QWEN3_NEXT, "torch_dtype": "bfloat16"}  # as the lab's GPUs serve it
HYBRID_DIR = "/srv/models/tiny-qwen3-next"


def test_a_hybrid_fleet_passes_gate_c_with_ds_conv_state_and_is_named_without_it(
        installed: Installer, tmp_path: Path) -> None:
    """A Mamba/GDN fleet configured as vLLM documents it (VLLM_SSM_CONV_STATE_LAYOUT=DS in
    NARWHAL_ENGINE_ENV, what NIXL's handoff of conv state needs) passes Gate C: the prediction
    reads the launch environment as the engines do. Without it Gate C blocks, naming the
    variable and the fix."""
    plan, op = installed.op.plan, installed.op
    local = write_model_dir(tmp_path / "hybrid", HYBRID_CONFIG, {
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    # the checkpoint's files, its tokenizer.json too (the router tokenizes with it)
    files = {p.name: p.read_text() for p in sorted(local.iterdir())}
    for h in plan.engines():  # the checkpoint placed on every engine host, as an operator does
        for name, text in files.items():
            done = ssh(plan, h.name, f"mkdir -p {HYBRID_DIR} && cat > {HYBRID_DIR}/{name} "
                                     f"<<'JSON'\n{text}\nJSON")
            assert done.returncode == 0, done.stderr
    ds = op.variant("hybrid-ds", NARWHAL_MODEL_DIR=HYBRID_DIR,
                    NARWHAL_ENGINE_ENV="'{\"VLLM_SSM_CONV_STATE_LAYOUT\":\"DS\"}'")
    plain = op.variant("hybrid-sd", NARWHAL_MODEL_DIR=HYBRID_DIR)
    try:
        for env, passes in ((ds, True), (plain, False)):
            _clear_containers(plan)  # discovery finds the ports free again
            assert op.discover(env=env)[0] == 0
            done = installed.install(env=env)
            assert done.returncode == 0, done.stdout + done.stderr
            code, doc = _engines(installed, env=env)
            if passes:
                assert code == 0 and doc["verdict"] == "passed", doc
                contract = json.loads((op.last_attempt("engines") / "contract.json")
                                      .read_text())
                assert contract["findings"] == [] and len(contract["engines"]) == 3, contract
                continue
            assert code != 0 and doc["verdict"] == "blocked", doc
            named = [p for p in doc["problems"] if "VLLM_SSM_CONV_STATE_LAYOUT" in p["field"]]
            assert named and all("VLLM_SSM_CONV_STATE_LAYOUT=DS" in p["fix"] for p in named), \
                doc["problems"]
    finally:
        _clear_containers(plan)
        for h in plan.engines():
            ssh(plan, h.name, f"rm -rf {HYBRID_DIR}")
        again = op.discover()  # Gate A as the .env says again
        assert again[0] == 0, again
