#!/usr/bin/env python3
"""Checkpoint staging on the lab: Gate A's staging of the lab model on 3 engine hosts against
the same bytes copied by one `scp` per host (all three at once, as staging runs), same run.

    .venv/bin/python bench/staging.py [--runs 3]

Brings the default lab up (its hub double serves the lab model), builds the wheelhouse in the
root namespace (where an index answers), pins the host keys, then per run: empties
/srv/models/staged on every engine host and times
  - staging, cold: the stage kit removed from every host first (what a first deploy pays);
  - staging, warm: the kit left in place (a later fleet's first staging of another model);
  - staging, eng3 cut from the hub (kit warm): eng3's files relayed through the workstation
    from a host that staged them;
  - scp: the checkpoint's files (the same bytes, built from the lab spec, checked against the
    pin's sha256) copied by `scp -r` to each host, three scp processes at once.
Staging's time is the span of its commands in Gate A's record (kit, host script, relay), so the
probes around it are not counted; `discover_s` is the whole command. Bytes from staging.json.
Needs root. Summary to results/staging-<time>.json. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _lab_gates import NARWHAL, REPO, lab_env, last_attempt, narwhal, write_results

from narwhal.deploy.package import wheelhouse
from narwhal.deploy.package.lock import load_lock
from narwhal.lab import labhub, lifecycle, spec
from narwhal.lab.hostfs import password_file, write_model_files
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

STAGED = "/srv/models/staged"
SCP_DIR = "/srv/models/scp"
MARKS = ("hub-kit", "narwhal-stage", ".narwhal-relay")


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _staging_span(attempt: Path) -> float:
    rows = [json.loads(line) for line in (attempt / "commands.jsonl").read_text().splitlines()]
    ours = [r for r in rows if any(m in a for a in r["argv"] for m in MARKS) and r.get("end")]
    return max(_stamp(r["end"]) for r in ours) - min(_stamp(r["start"]) for r in ours)


def _wheels() -> Path:
    lock_path = REPO / "runtime.lock"
    folder = REPO / ".cache" / f"wheelhouse-{hashlib.sha256(lock_path.read_bytes()).hexdigest()[:16]}"
    wheelhouse.build(folder, lock_path, load_lock(lock_path))
    return folder


def _stage(plan: LabPlan, env: Path, runs: Path, wheels: Path, cold: bool) -> dict[str, Any]:
    for h in plan.engines():
        ssh(plan, h.name, f"rm -rf {STAGED}" + (" ~/Narwhal-deploy/hub-kit" if cold else ""))
    t0 = time.monotonic()
    done = narwhal(env, runs, "discover", "--json", "--wheelhouse", str(wheels))
    wall = time.monotonic() - t0
    doc = json.loads(done.stdout)
    if doc.get("verdict") != "passed":
        raise SystemExit(f"bench: discovery did not pass: {doc}")
    attempt = last_attempt(runs, "bench", "discover")
    staging = json.loads((attempt / "staging.json").read_text())
    return {"staging_s": round(_staging_span(attempt), 3), "discover_s": round(wall, 3),
            "bytes": staging["bytes"], "checkpoint_bytes": doc["checkpoint"]["bytes"]}


def _scp(plan: LabPlan, folder: Path) -> float:
    procs = []
    t0 = time.monotonic()
    for h in plan.engines():
        ssh(plan, h.name, f"rm -rf {SCP_DIR}")
        user = next(u for u in h.host.users if u.name == "root")
        scp = ["scp", "-q", "-r", "-F", str(plan.ssh_config), str(folder),
               f"root@{h.mgmt_ip}:{SCP_DIR}"]
        if user.auth == "password":  # the lab's config is BatchMode (keys only)
            scp = ["sshpass", "-f", str(password_file(plan, h.name, "root")), scp[0],
                   "-o", "BatchMode=no", *scp[1:]]
        procs.append(subprocess.Popen([NARWHAL, "lab", "exec", "--", *scp]))
    codes = [p.wait(timeout=600) for p in procs]
    took = time.monotonic() - t0
    if any(codes):
        raise SystemExit(f"bench: scp failed: {codes}")
    return round(took, 3)


def _checkpoint(plan: LabPlan, where: Path, pin: dict[str, Any]) -> Path:
    """The pinned files, rebuilt here from the lab spec and held to the pin's sha256."""
    folder = where / "checkpoint"
    write_model_files(plan.spec, folder)
    if not (folder / "model.safetensors").exists():
        (folder / "model.safetensors").write_bytes(labhub.weights())
    for f in pin["files"]:
        if hashlib.sha256((folder / f["path"]).read_bytes()).hexdigest() != f["sha256"]:
            raise SystemExit(f"bench: {f['path']} is not the pinned file")
    for extra in {p.name for p in folder.iterdir()} - {f["path"] for f in pin["files"]}:
        (folder / extra).unlink()
    return folder


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    wheels = _wheels()
    lab_spec = spec.load(None)
    lifecycle.down(lab_spec.name)
    plan = lifecycle.up(lab_spec)
    access = labhub.hub_access(plan)
    assert access is not None
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="narwhal-staging-") as tmp:
            env, runs = lab_env(plan, Path(tmp) / ".env", "bench", "0" * 40), Path(tmp) / "runs"
            with env.open("a") as fh:
                fh.write(f"MODEL_REPO_ID={access.repo_id}\nHF_ENDPOINT={access.endpoint}\n")
            text = env.read_text().replace("NARWHAL_MODEL_DIR=/srv/models/tiny-llama",
                                           f"NARWHAL_MODEL_DIR={STAGED}")
            env.write_text(text)
            if narwhal(env, runs, "hosts", "trust", "--yes").returncode != 0:
                raise SystemExit("bench: could not pin the lab's host keys")
            folder: Path | None = None
            for k in range(args.runs):
                cold = _stage(plan, env, runs, wheels, cold=True)
                warm = _stage(plan, env, runs, wheels, cold=False)
                subprocess.run([NARWHAL, "lab", "fault", "hub-cut", "eng3"], check=True,
                               capture_output=True)
                try:
                    cut = _stage(plan, env, runs, wheels, cold=False)
                finally:
                    subprocess.run([NARWHAL, "lab", "fault", "clear"], check=True,
                                   capture_output=True)
                if folder is None:
                    folder = _checkpoint(plan, Path(tmp), json.loads((last_attempt(
                        runs, "bench", "discover") / "checkpoint.json").read_text()))
                scp_s = _scp(plan, folder)
                row = {"run": k + 1, "cold": cold, "warm": warm, "eng3_cut": cut,
                       "scp_s": scp_s}
                rows.append(row)
                print(f"run {k + 1}: staging cold {cold['staging_s']:.2f} s, warm "
                      f"{warm['staging_s']:.2f} s, eng3 cut {cut['staging_s']:.2f} s, scp x3 "
                      f"{scp_s:.2f} s", flush=True)
            if folder is not None:
                shutil.rmtree(folder)
    finally:
        lifecycle.down(lab_spec.name)
    med = {key: statistics.median(r[key]["staging_s"] for r in rows)
           for key in ("cold", "warm", "eng3_cut")}
    scp = statistics.median(r["scp_s"] for r in rows)
    summary = {"hosts": 3, "runs": len(rows), "checkpoint_bytes": rows[0]["cold"][
                   "checkpoint_bytes"],
               "staging_cold_s": med["cold"], "staging_warm_s": med["warm"],
               "staging_eng3_cut_s": med["eng3_cut"], "scp_s": scp,
               "cold_over_scp": round(med["cold"] / scp, 2),
               "warm_over_scp": round(med["warm"] / scp, 2),
               "bytes_cold": rows[0]["cold"]["bytes"], "bytes_warm": rows[0]["warm"]["bytes"],
               "bytes_eng3_cut": rows[0]["eng3_cut"]["bytes"],
               "scp_bytes_from_workstation": 3 * rows[0]["cold"]["checkpoint_bytes"]}
    write_results("staging", summary, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
