"""Gate B on the lab, driven from the workstation namespace as an operator runs it.

The lab hosts have no route off the machine, so the install can only pass offline: from the
wheelhouse built here in the root namespace (where a package index is reachable, as on an
operator's workstation) and the revision's bundle, both sent over SSH. The checkout is a
clean clone of this repository's HEAD: the approved revision is whatever was committed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.lab.installing import Installer, rows
from tests.lab.operator import NARWHAL

from narwhal.deploy.gates.install_rules import RELAY_MIN_BYTES
from narwhal.deploy.hosts import commandline as cl
from narwhal.lab.faults import Faults
from narwhal.lab.testing import ssh

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]


def _pip_rows(attempt: Path) -> list[dict[str, Any]]:
    return [r for r in rows(attempt) if r["argv"][1:4] == ["-m", "pip", "install"]]


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_install_puts_the_revision_on_every_host_offline_at_once(installer: Installer) -> None:
    for alias in ("node-1", "node-2", "node-3", "router"):  # hosts as new (other modules
        ssh(installer.op.plan, installer.lab_host(alias), "rm -rf /root/Narwhal-deploy")  # install)
    done = installer.install()
    doc = installer.doc(done)
    assert done.returncode == 0 and doc["verdict"] == "passed", doc
    assert sorted(doc["hosts"]) == ["node-1", "node-2", "node-3", "router"]
    attempt = installer.op.last_attempt("install")
    for alias, result in doc["hosts"].items():
        assert result["outcome"] == "installed" and result["pip_ran"], result
        command = "narwhal-serve" if alias == "router" else "narwhal-engine"
        out = ssh(installer.op.plan, installer.lab_host(alias),
                  f"cat {installer.remote}/installed; git -C {installer.remote}/checkout "
                  f"rev-parse HEAD; {installer.remote}/venv/bin/{command} --help >/dev/null && "
                  "echo runs; ip route get 192.0.2.1 >/dev/null 2>&1 || echo no-route-out")
        assert out.stdout.split() == [installer.revision, installer.revision, "runs",
                                      "no-route-out"], out
    # the workstation sent the shared files to node-1 only; the others pulled them from it
    assert doc["hosts"]["node-1"]["relayed_from"] is None
    for alias in ("node-2", "node-3", "router"):
        assert doc["hosts"][alias]["relayed_from"] == "node-1", doc["hosts"][alias]
        assert doc["hosts"][alias]["files_relayed"] >= 20, doc["hosts"][alias]
    sent = [(r["host"], r["argv"][5].rsplit("/", 1)[1])  # a put: sh -c PUT_FILE sh part path
            for r in rows(attempt) if r["argv"][:3] == ["sh", "-c", cl.PUT_FILE]
            and "/wheelhouse/" in r["argv"][5]]
    size = {name: (installer.wheels / name).stat().st_size for _, name in sent}
    assert sum(size[name] for host, name in sent if host == "node-1") > 10 * 2**20
    assert all(size[name] < RELAY_MIN_BYTES for host, name in sent if host != "node-1"), sent
    assert ssh(installer.op.plan, installer.lab_host("node-1"),
               "pgrep -f '[T]hreadingHTTPServer' || echo none").stdout.split() == ["none"]
    pips = _pip_rows(attempt)
    assert sorted(r["host"] for r in pips) == ["node-1", "node-2", "node-3", "router"]
    assert all("--no-index" in r["argv"] and "--require-hashes" in r["argv"] for r in pips)
    spans = [(datetime.fromisoformat(r["start"].replace("Z", "+00:00")),
              datetime.fromisoformat(r["end"].replace("Z", "+00:00"))) for r in pips]
    first_end = min(end for _, end in spans)
    assert all(start < first_end for start, _ in spans), spans  # the hosts' pips overlapped


def test_secrets_reach_hosts_only_as_0600_files_and_ssh_credentials_never(installer: Installer) -> None:
    run = json.loads((installer.op.last_attempt("install") / "plan.json").read_text())
    folder = f"{installer.remote}/runs/{run['prepared_run']}/secrets"
    secret_file = f"{folder}/NARWHAL_HF_TOKEN"
    for alias in ("node-1", "router"):
        out = ssh(installer.op.plan, installer.lab_host(alias),
                  f"stat -c %a {secret_file}; cat {secret_file}; echo; grep -rlF "
                  f"'{installer.token}' {installer.remote} || true")
        lines = out.stdout.split()
        assert lines[:2] == ["600", installer.token], out
        # no other file on the host holds it but the engine's own HF_TOKEN, also 0600
        engine_copy = [f"{folder}/env/HF_TOKEN"] if alias != "router" else []
        assert sorted(lines[2:]) == sorted([secret_file, *engine_copy]), lines
        for path in engine_copy:
            assert ssh(installer.op.plan, installer.lab_host(alias),
                       f"stat -c %a {path}").stdout.strip() == "600"
    password = next(line.split("=", 1)[1].strip("'\"") for line in
                    installer.op.env.read_text().splitlines()
                    if "_SSH_PASSWORD=" in line)
    for secret in (installer.token, password):
        leaked = [str(p) for p in installer.op.runs.rglob("*") if p.is_file()
                  and secret.encode() in p.read_bytes()]
        assert leaked == []  # argv, outputs, evidence, prepared runs: none holds it
    for alias in ("node-1", "node-2", "node-3", "router"):  # the SSH password goes nowhere
        out = ssh(installer.op.plan, installer.lab_host(alias),
                  f"grep -rlF -- '{password}' {installer.remote} || echo none")
        assert out.stdout.split() == ["none"], out


def test_a_second_install_verifies_every_host_and_runs_no_pip(installer: Installer) -> None:
    done = installer.install()
    doc = installer.doc(done)
    assert done.returncode == 0, doc
    assert {r["outcome"] for r in doc["hosts"].values()} == {"verified"}
    assert _pip_rows(installer.op.last_attempt("install")) == []


def test_a_prepared_file_edited_after_planning_blocks_before_any_host_changes(
        installer: Installer) -> None:
    prepared = installer.doc(installer.install("--prepare-only"))
    edited = Path(prepared["folder"]) / "node-1" / "env" / "engine-1.env"
    original = edited.read_bytes()
    edited.write_bytes(original + b"NARWHAL_TTFT_S=99\n")
    try:
        done = installer.install("--prepared", prepared["prepared_run"])
        doc = installer.doc(done)
        assert done.returncode != 0 and doc["verdict"] == "blocked"
        assert "prepared input changed" in doc["cause"] and str(edited) in doc["cause"]
        assert rows(installer.op.last_attempt("install")) == []  # no host was asked anything
    finally:
        edited.write_bytes(original)


def test_a_different_file_at_a_target_is_refused_and_left_as_it_was(installer: Installer) -> None:
    env = installer.op.variant("slower", NARWHAL_TTFT_S="20")
    prepared = installer.doc(installer.install("--prepare-only", env=env))
    run = prepared["prepared_run"]
    target = f"{installer.remote}/runs/{run}/env/engine-2.env"
    host = installer.lab_host("node-2")
    ssh(installer.op.plan, host, f"mkdir -p $(dirname {target}) && echo operator > {target}")
    try:
        done = installer.install("--prepared", run, env=env)
        doc = installer.doc(done)
        assert done.returncode != 0 and doc["verdict"] == "blocked"
        assert any(target in p["problem"] and "left as it is" in p["problem"]
                   for p in doc["problems"]), doc["problems"]
        assert ssh(installer.op.plan, host, f"cat {target}").stdout == "operator\n"
    finally:
        ssh(installer.op.plan, host, f"rm -rf {installer.remote}/runs/{run}")


def test_pip_killed_mid_install_is_recovered_and_resumed(installer: Installer,
                                                         faults: Faults) -> None:
    host = installer.lab_host("node-1")
    ssh(installer.op.plan, host, f"rm -rf {installer.remote}/venv")  # the operator starts over
    pids: list[int] = []

    def pip_running() -> bool:
        found = ssh(installer.op.plan, host, "pgrep -f -- '[-]m pip install' || true").stdout
        pids.extend(int(p) for p in found.split()[:1])
        return bool(pids)

    verdict = installer.cut_install(pip_running, lambda: faults.kill(host, pids[0]))
    assert verdict["verdict"] == "blocked"
    failed = installer.op.last_attempt("install")
    before = _tree(failed)
    recovered = installer.op.narwhal("recover", "install")
    assert recovered.returncode == 0, recovered.stderr
    assert "venv" in recovered.stdout and "removed" in recovered.stdout
    assert ssh(installer.op.plan, host, f"test -e {installer.remote}/venv || "
               "echo gone").stdout.strip() == "gone"
    assert ssh(installer.op.plan, host, f"git -C {installer.remote}/checkout rev-parse HEAD"
               ).stdout.strip() == installer.revision  # not the failed attempt's: kept
    done = installer.install()
    doc = installer.doc(done)
    assert done.returncode == 0, doc
    assert doc["hosts"]["node-1"]["pip_ran"] and doc["hosts"]["node-2"]["outcome"] == "verified"
    assert _tree(failed) == before


def test_a_connection_cut_mid_transfer_is_resumed_by_the_same_command(
        installer: Installer, faults: Faults) -> None:
    host = installer.lab_host("node-1")  # the host the workstation sends the wheels to
    wheels = f"{installer.remote}/wheelhouse"
    ssh(installer.op.plan, host, f"rm -rf {wheels} {installer.remote}/venv")  # sent again

    def mid_transfer() -> bool:
        out = ssh(installer.op.plan, host, f"ls {wheels} 2>/dev/null | wc -l").stdout
        return 2 <= int(out.strip() or 0) < 20  # some of node-1's wheels are there, not all

    # The power goes while the wheels arrive: the SSH connection is cut mid-transfer.
    verdict = installer.cut_install(mid_transfer, lambda: faults.crash(host))
    assert verdict["verdict"] == "blocked"
    failed = installer.op.last_attempt("install")
    before = _tree(failed)
    faults.clear()  # the host boots again
    done = installer.install()
    doc = installer.doc(done)
    assert done.returncode == 0, doc
    node1 = doc["hosts"]["node-1"]
    assert node1["files_present"] >= 2 and node1["files_sent"] >= 1 and node1["pip_ran"]
    assert _tree(failed) == before


def test_deploy_cut_mid_install_stops_at_b_and_the_next_deploy_resumes_it(
        installer: Installer, faults: Faults) -> None:
    """The fault drill "SSH cut mid-install", through `narwhal deploy`: A kept, B resumed."""
    host = installer.lab_host("node-1")  # the host the workstation sends the wheels to
    wheels = f"{installer.remote}/wheelhouse"
    ssh(installer.op.plan, host, f"rm -rf {wheels} {installer.remote}/venv")  # sent again
    op = installer.op
    # an operator's edit to the launch policy: A and B are stale, so deploy runs both
    env = op.variant("drill-policy", NARWHAL_NODE_2_GPU_MEMORY_UTILIZATION="0.85")
    argv = [NARWHAL, "lab", "exec", "--", NARWHAL, "deploy", "--until", "B", "--json",
            "--checkout", str(installer.checkout), "--wheelhouse", str(installer.wheels),
            "--env", str(env), "--runs", str(op.runs)]
    running = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not 2 <= int(ssh(op.plan, host, f"ls {wheels} 2>/dev/null | wc -l").stdout
                           .strip() or 0) < 20:
            assert running.poll() is None and time.monotonic() < deadline, \
                "the deploy ended before the moment to cut it came"
            time.sleep(0.05)
        faults.crash(host)  # the power goes while node-1's wheels arrive
        out, err = running.communicate(timeout=300)
    finally:
        if running.poll() is None:
            running.kill()
    try:
        stopped = json.loads(out)  # one document on stdout, whatever a cut connection printed
    except ValueError:
        raise AssertionError(f"exit {running.returncode}; stdout: {out[-2000:]!r}; "
                             f"stderr: {err[-4000:]}") from None
    assert running.returncode == 1 and stopped["stopped_at"] == "install", stopped
    assert [s["action"] for s in stopped["steps"]] == ["ran", "ran"], stopped["steps"]
    failed = op.last_attempt("install")
    before = _tree(failed)
    faults.clear()  # the host boots again
    done = op.narwhal("deploy", "--until", "B", "--json", "--checkout", str(installer.checkout),
                      "--wheelhouse", str(installer.wheels), env=env)
    doc = json.loads(done.stdout)
    assert done.returncode == 0 and doc["verdict"] == "passed", doc
    assert [(s["gate"], s["action"]) for s in doc["steps"]] == [("discover", "kept"),
                                                                 ("install", "ran")]  # A held
    node1 = doc["steps"][1]["output"]["hosts"]["node-1"]
    assert node1["files_present"] >= 2 and node1["pip_ran"], node1  # resumed, not restarted
    assert _tree(failed) == before  # the failed attempt's evidence kept as it was


def test_a_role_shell_command_runs_in_the_checkout_with_the_role_env_and_venv(
        installer: Installer) -> None:
    script = 'echo "$PWD $NARWHAL_ROLE $VIRTUAL_ENV"; git rev-parse HEAD; command -v narwhal-engine'
    done = subprocess.run([NARWHAL, "lab", "exec", "--", NARWHAL, "shell", "--env",
                           str(installer.op.env), "--runs", str(installer.op.runs), "--role",
                           "engine-2", "--", "sh", "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{installer.remote}/checkout engine-2 {installer.remote}/venv", installer.revision,
        f"{installer.remote}/venv/bin/narwhal-engine"]
    ledger = json.loads((installer.op.runs / "lab" / "ledger.json").read_text())
    last = ledger["activities"]["shell"]["attempts"][-1]
    recorded = rows(installer.op.runs / "lab" / "shell" / last)
    assert recorded[-1]["host"] == "node-2" and recorded[-1]["argv"][-1] == script
    bad = subprocess.run([NARWHAL, "lab", "exec", "--", NARWHAL, "shell", "--env",
                          str(installer.op.env), "--runs", str(installer.op.runs), "--role",
                          "engine-9", "--", "true"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert bad.returncode == 2 and "'engine-9' is not a role" in bad.stderr


@pytest.mark.parametrize("values, expected", [
    ({"NARWHAL_DEPLOYMENT_REVISION": "e80261ef"}, "NARWHAL_DEPLOYMENT_REVISION"),
    ({"NARWHAL_DEPLOYMENT_REVISION": "f" * 40}, "is not a commit in"),
    ({"NARWHAL_ENGINE_ENV": '{"SSHPASS":"hunter2"}'},
     "NARWHAL_ENGINE_ENV: would carry the SSH variable SSHPASS"),
])
def test_bad_inputs_are_named_before_anything_is_sent(installer: Installer,
                                                      values: dict[str, str],
                                                      expected: str) -> None:
    before = installer.attempts()
    done = installer.install(env=installer.op.variant("bad", **values))
    assert done.returncode != 0
    assert expected in done.stdout + done.stderr, done.stdout + done.stderr
    assert installer.attempts() == before


def test_a_dirty_checkout_at_the_revision_is_refused(installer: Installer) -> None:
    readme = installer.checkout / "README.md"
    original = readme.read_bytes()
    readme.write_bytes(original + b"\nan edit that is not committed\n")
    try:
        done = installer.install()
        assert done.returncode != 0 and "uncommitted changes (README.md)" in done.stderr
    finally:
        readme.write_bytes(original)


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_wheelhouse_missing_a_pin_or_holding_a_wrong_hash_is_refused(
        installer: Installer, tmp_path: Path, damage: str) -> None:
    copy = tmp_path / "wheels"
    shutil.copytree(installer.wheels, copy)
    victim = next(copy.glob("pydantic-*.whl"))
    if damage == "missing":
        victim.unlink()
    else:
        victim.write_bytes(victim.read_bytes() + b"\0")
    before = installer.attempts()
    done = installer.install(wheels=copy)
    assert done.returncode != 0
    words = "pydantic==2.14.3: no wheel for this pin" if damage == "missing" else \
        f"{victim.name}: sha256"
    assert words in done.stderr, done.stderr
    assert installer.attempts() == before


def test_a_host_whose_python_the_wheelhouse_cannot_serve_blocks_naming_it(
        installer: Installer, faults: Faults) -> None:
    faults.python(installer.lab_host("node-2"), "3.12.4")
    try:
        code, doc = installer.op.discover()  # Gate A accepts 3.12; Gate B's wheels are cp311
        assert code == 0, doc
        done = installer.install()
        doc = installer.doc(done)
        assert done.returncode != 0 and doc["verdict"] == "blocked"
        assert any(p["field"] == "node-2: python3" and "3.12.4" in p["problem"]
                   for p in doc["problems"]), doc
    finally:
        faults.clear()
        assert installer.op.discover()[0] == 0
