"""`lab up` / `lab down`: fast, refuses unsafe subnets, and leaves nothing behind."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from narwhal.lab import lifecycle, spec
from narwhal.lab.defaults import default_spec_document
from narwhal.lab.plan import LabPlan
from narwhal.lab.run import LabError

CYCLE_NAME = "nwc"


def _cycle_spec() -> spec.LabSpec:
    doc = copy.deepcopy(default_spec_document())
    doc.update(name=CYCLE_NAME)
    doc["management"]["subnet"] = "10.215.0.0/24"
    doc["fabric"]["subnet"] = "10.216.0.0/24"
    return spec.validate(doc, "cycle spec")


def _footprint(prefix: str, lab_dir: str) -> dict[str, list[str]]:
    """Everything a lab could leave: namespaces, links, routes, mounts, processes."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout)
    routes = subprocess.run(["ip", "route", "show", "type", "unreachable"], capture_output=True, text=True,
                            check=True).stdout
    mounts = Path("/proc/self/mountinfo").read_text()
    procs = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if lab_dir in cmd:
                procs.append(f"{entry.name}: {cmd}")
    return {
        "netns": [n for n in netns.split() if n.startswith(prefix)],
        "links": [ln["ifname"] for ln in links if ln["ifname"].startswith(("br-", prefix))],
        "routes": [r for r in routes.splitlines() if "10.215." in r or "10.216." in r],
        "mounts": [m for m in mounts.splitlines() if lab_dir in m or f"/run/netns/{prefix}" in m],
        "procs": procs,
    }


@pytest.mark.lab
def test_default_lab_comes_up_within_ten_seconds(needs_lab: LabPlan) -> None:
    # Measured by `up` itself (spawned sshds listening, keys pinned). Typically 0.3-1.5 s on two
    # busy cores; 10 s is the target, so a failure here is a real regression.
    state = json.loads(needs_lab.state_file.read_text())
    assert state["up_seconds"] < 10.0


@pytest.mark.lab
def test_twenty_up_down_cycles_leave_nothing_behind(needs_lab: LabPlan) -> None:
    lab_spec = _cycle_spec()
    lab_dir = str(lifecycle.default_state_path(CYCLE_NAME).parent)
    lifecycle.down(CYCLE_NAME)
    downs = []
    for _ in range(20):
        plan = lifecycle.up(lab_spec)
        # the switch, the workstation, each host, and the hub when the spec has one
        assert len(_footprint(plan.prefix, lab_dir)["netns"]) == \
            len(plan.hosts) + 2 + (plan.spec.hub is not None)
        started = time.monotonic()
        lifecycle.down(CYCLE_NAME)
        downs.append(time.monotonic() - started)
    # 5 s is the target for one `down`; typically 0.2-0.6 s here.
    assert max(downs) < 5.0, downs
    assert _footprint(CYCLE_NAME + "-", lab_dir) == {"netns": [], "links": [], "routes": [], "mounts": [],
                                                      "procs": []}
    assert not Path(lab_dir).exists()


@pytest.mark.lab
def test_down_cleans_a_crashed_run_by_prefix(needs_lab: LabPlan) -> None:
    plan = lifecycle.up(_cycle_spec())
    # Simulate a crash of the `up` process: the state file is lost, namespaces and hosts remain.
    (plan.dir / "state.json").rename(plan.dir / "lost.json")
    with pytest.raises(LabError, match="already up or was left by a crash"):
        lifecycle.up(_cycle_spec())
    lifecycle.down(CYCLE_NAME)
    assert _footprint(plan.prefix, "/nonexistent")["netns"] == []
    lifecycle.down(CYCLE_NAME)  # a second down is harmless
    subprocess.run(["ip", "route", "del", "unreachable", "10.215.0.0/24"], capture_output=True, check=False)
    subprocess.run(["ip", "route", "del", "unreachable", "10.216.0.0/24"], capture_output=True, check=False)
    import shutil

    shutil.rmtree(plan.dir, ignore_errors=True)


@pytest.mark.lab
def test_up_refuses_a_subnet_the_root_namespace_already_reaches(needs_lab: LabPlan) -> None:
    root_net = subprocess.run(["ip", "-j", "route", "show", "scope", "link"], capture_output=True, text=True,
                              check=True).stdout
    connected = [r["dst"] for r in json.loads(root_net) if "/" in r.get("dst", "") and r["dst"].endswith("/24")]
    if not connected:
        pytest.skip("the root namespace has no connected /24 to collide with")
    doc = copy.deepcopy(default_spec_document())
    doc.update(name="nwx")
    doc["management"]["subnet"] = connected[0]
    try:
        lab_spec = spec.validate(doc, "colliding spec")
    except Exception:
        pytest.skip(f"{connected[0]} is not a private range the spec accepts")
    with pytest.raises(LabError, match="already reachable from the root namespace"):
        lifecycle.up(lab_spec)
    assert _footprint("nwx-", "/run/narwhal-lab/nwx")["netns"] == []


@pytest.mark.lab
def test_cli_up_prints_env_vocabulary_and_writes_private_env(needs_lab: LabPlan, tmp_path: Path) -> None:
    env_out = tmp_path / "lab.env"
    cmd = [sys.executable, "-m", "narwhal.lab.cli"]
    lifecycle.down("nwc")
    up = subprocess.run([*cmd, "up", "--spec", str(_write_spec(tmp_path)), "--env-out", str(env_out)],
                        capture_output=True, text=True, check=False, timeout=60)
    try:
        assert up.returncode == 0, up.stderr
        lines = dict(ln.split("=", 1) for ln in up.stdout.splitlines() if "=" in ln and not ln.startswith("#"))
        assert lines["NARWHAL_ROUTER_SSH"] == "root@10.215.0.10"
        assert lines["NARWHAL_NODE_3_SSH"] == "root@10.215.0.13"
        assert lines["NARWHAL_NODE_2_IP"] == "10.216.0.12"
        assert lines["NARWHAL_ENGINE_IMAGE"].startswith("sha256:") and len(lines["NARWHAL_ENGINE_IMAGE"]) == 71
        assert "NARWHAL_DEPLOYMENT_REVISION" not in lines
        password = env_out.read_text().split("NARWHAL_NODE_3_SSH_PASSWORD=")[1].split()[0]
        assert password.strip("'") not in up.stdout + up.stderr  # the secret is only in the 0600 file
        assert os.stat(env_out).st_mode & 0o777 == 0o600
        status = subprocess.run([*cmd, "status", "--name", "nwc", "--json"], capture_output=True, text=True,
                                check=False)
        assert all(h["running"] for h in json.loads(status.stdout)["hosts"].values())
    finally:
        down = subprocess.run([*cmd, "down", "--name", "nwc"], capture_output=True, text=True, check=False)
    assert down.returncode == 0


def _write_spec(tmp_path: Path) -> Path:
    doc = copy.deepcopy(default_spec_document())
    doc.update(name="nwc")
    doc["management"]["subnet"] = "10.215.0.0/24"
    doc["fabric"]["subnet"] = "10.216.0.0/24"
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(doc))
    return path
