#!/usr/bin/env python3
"""What every gate costs as the fleet grows: 4, 8, 16 and 32 lab hosts, deployed gate by gate.

    .venv/bin/python bench/scale.py [--hosts 4,8,16,32] [--seconds 1] [--deploy]
                                    [--add-to RESULTS.json] [--keep DIR]

For each size a lab of the default spec scaled to HOSTS - 1 engine hosts and the router host
(`narwhal lab up --engines N`; its own name and subnets, so the session lab may stay) is
brought up and `narwhal` runs each gate in turn from the lab's workstation namespace, exactly
as an operator would (`hosts trust`, A, B with its preparation in the root namespace where a
package index answers, C, D with `--seconds S --omit 0`, E, F, G). Per gate:
- wall time, from outside the command;
- the workstation's own CPU seconds: the command and every process it starts (the SSH
  masters and clients included) run in a cpuacct cgroup of their own;
- bytes the workstation namespace sent (its interfaces' TX counters) and the SSH connections
  it opened (SYNs to port 22, counted by an iptables rule of the bench in that namespace);
- the critical path: the longest chain of the attempt's remote commands in which each starts
  after the one before it ended (commands.jsonl), as a count and in seconds;
- for Gate D, the overhead per edge beyond its sample: (the sampling phase - edges x S) / edges.
With `--deploy` every size is deployed by one `narwhal deploy` instead (Gate D with
`--fabric-seconds S --fabric-omit 0`, B from the wheelhouse downloaded here and Narwhal's
wheels built once for all sizes), and each gate's wall, CPU, bytes and SYNs are read when
its progress line says it starts; the access and live checks before gate A are kept apart.
Every figure is then fitted against the hosts (constant, linear, quadratic; the lowest degree
whose fit explains 98 % of the variance is named) and plotted. On this machine every host
shares two cores, so the hosts' own CPU is this machine's limit, not Narwhal's; the
workstation's CPU, bytes and round trips are what Narwhal spends. Needs root. Summary and plot
to results/scale-<time>.{json,png}. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _lab_gates import NARWHAL, clean_checkout, lab_env, write_results
from _scale_figures import critical_path, edge_overhead_s, fits, plot

from narwhal.core.gates import GATE_NAMES
from narwhal.deploy.package import prepared, wheelhouse
from narwhal.deploy.package.lock import load_lock
from narwhal.lab import defaults, lifecycle, spec
from narwhal.lab.plan import LabPlan

NAME = "nws"
SUBNETS = ("10.215.0.0/24", "10.216.0.0/24")  # beside the session lab's 10.213/10.214
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
SSH_RULE = ["OUTPUT", "-p", "tcp", "--dport", "22", "--syn", "-m", "comment", "--comment",
            "narwhal-scale-bench"]


def scaled_lab(hosts: int) -> spec.LabSpec:
    doc = defaults.scaled_spec_document(hosts - 1, NAME)
    doc["management"]["subnet"], doc["fabric"]["subnet"] = SUBNETS
    return spec.validate(doc, f"the scale bench's {hosts}-host lab")


def in_ws(plan: LabPlan, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", plan.ws_netns, *argv]


def ws_counters(plan: LabPlan) -> tuple[int, int]:
    """(bytes sent by the workstation namespace's interfaces, SSH SYNs it sent so far)."""
    dev = subprocess.run(in_ws(plan, ["cat", "/proc/net/dev"]), capture_output=True,
                         text=True, check=True).stdout
    sent = sum(int(line.split(":", 1)[1].split()[8]) for line in dev.splitlines()[2:]
               if line.split(":", 1)[0].strip() != "lo")
    rules = subprocess.run(in_ws(plan, ["iptables", "-L", "OUTPUT", "-v", "-x", "-n"]),
                           capture_output=True, text=True, check=True).stdout
    syns = sum(int(line.split()[0]) for line in rules.splitlines()
               if "narwhal-scale-bench" in line)
    return sent, syns


Reading = tuple[float, float, int, int]  # (monotonic s, cgroup CPU s, bytes sent, SSH SYNs)


class Metered:
    """A cpuacct cgroup of its own for the commands run through `argv`, and readings of it
    with the workstation namespace's counters: what a command or a stretch of it cost."""

    def __init__(self, plan: LabPlan, label: str) -> None:
        self.plan = plan
        self.group = CGROUP_ROOT / f"narwhal-scale-{label}-{time.monotonic_ns()}"
        self.group.mkdir()
        self.env = dict(os.environ, NARWHAL_LAB_SSH_CONFIG=str(plan.ssh_config))

    def argv(self, argv: list[str], in_lab: bool = True) -> list[str]:
        enter = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.group)]
        return enter + (in_ws(self.plan, argv) if in_lab else argv)

    def read(self) -> Reading:
        sent, syns = ws_counters(self.plan)
        cpu_s = int((self.group / "cpuacct.usage").read_text()) / 1e9
        return time.monotonic(), cpu_s, sent, syns

    def close(self) -> None:
        _remove_group(self.group)


def figures(a: Reading, b: Reading) -> dict[str, Any]:
    return {"wall_s": round(b[0] - a[0], 3), "ws_cpu_s": round(b[1] - a[1], 3),
            "ws_bytes_sent": b[2] - a[2], "ssh_connections": b[3] - a[3]}


def timed(plan: LabPlan, argv: list[str], *, in_lab: bool, label: str) -> dict[str, Any]:
    """Run one narwhal command in a cgroup of its own; its wall, CPU, bytes and SSH SYNs."""
    meter = Metered(plan, label)
    try:
        before = meter.read()
        done = subprocess.run(meter.argv(argv, in_lab), capture_output=True, text=True,
                              check=False, env=meter.env)
        after = meter.read()
    finally:
        meter.close()
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[1:3])} failed: {done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    return figures(before, after)


GATE_MARK = re.compile(r"^\[\d+/\d+\] gate [A-G] (\w+):")


def deployed(plan: LabPlan, argv: list[str], out: Path) -> dict[str, dict[str, Any]]:
    """Run `narwhal deploy` in a cgroup of its own; each gate's wall, CPU, bytes and SSH SYNs,
    read at the moments its progress says a gate starts (the access and live checks before
    gate A are `before_gates`)."""
    meter = Metered(plan, "deploy")
    marks: list[tuple[str, Reading]] = [("before_gates", meter.read())]
    tail: list[str] = []
    try:
        with out.open("w") as stdout:
            running = subprocess.Popen(meter.argv(argv), stdout=stdout, stderr=subprocess.PIPE,
                                       text=True, env=meter.env)
            assert running.stderr is not None
            for line in running.stderr:
                tail = [*tail, line][-40:]
                if (gate := GATE_MARK.match(line)) is not None:
                    marks.append((gate[1], meter.read()))
                    print(f"bench: {line.rstrip()}", flush=True)
            code = running.wait()
        marks.append(("end", meter.read()))
    finally:
        meter.close()
    measured = {a[0]: figures(a[1], b[1]) for a, b in itertools.pairwise(marks)}
    if code != 0:  # what was measured up to the failure is kept beside the document
        kept = out.with_name(f"failed-{out.stem}-gates.json")
        kept.write_text(json.dumps({"exit": code, "gates": measured}, indent=1) + "\n")
        raise SystemExit(f"bench: deploy failed ({code}): {''.join(tail)}\n"
                         f"its document ({out}): {out.read_text()[-6000:]}\n"
                         f"the gates measured until then: {kept}")
    return measured


def _remove_group(group: Path) -> None:
    """Move what is left in the cgroup (nothing, normally) to the root, then remove it."""
    for pid in (group / "cgroup.procs").read_text().split():
        (CGROUP_ROOT / "cgroup.procs").write_text(pid)
    group.rmdir()


def one_size(hosts: int, seconds: int, checkout: Path, revision: str, tmp: Path,
             wheels: Path | None = None) -> dict[str, Any]:
    """Every gate on a fresh lab of `hosts` hosts, gate by gate or, given the `wheels`
    downloaded here, in one `narwhal deploy`; the figures per gate."""
    lab_spec = scaled_lab(hosts)
    lifecycle.down(NAME)
    t0 = time.monotonic()
    plan = lifecycle.up(lab_spec)
    up_s = time.monotonic() - t0
    mem0 = _available_bytes()
    passed = False
    try:
        subprocess.run(in_ws(plan, ["iptables", "-I", *SSH_RULE, "-j", "ACCEPT"]), check=True)
        env = lab_env(plan, tmp / f".env-{hosts}", "scale", revision)
        runs = tmp / f"runs-{hosts}"

        def gate(label: str, *args: str, in_lab: bool = True) -> dict[str, Any]:
            argv = [NARWHAL, *args, "--env", str(env), "--runs", str(runs)]
            got = timed(plan, argv, in_lab=in_lab, label=label)
            print(f"{hosts} hosts: {label} {got}", flush=True)
            return got

        gate("trust", "hosts", "trust", "--yes")
        row: dict[str, Any] = {"hosts": hosts, "engine_hosts": hosts - 1,
                               "lab_up_s": round(up_s, 2), "gates": {}}
        if wheels is not None:
            runs.mkdir(exist_ok=True)
            (runs / "builds").symlink_to(tmp / "shared-runs" / "builds")  # built once: prebuilt
            row["gates"] = deployed(plan, [NARWHAL, "deploy", "--json", "--wheelhouse",
                                           str(wheels), "--checkout", str(checkout),
                                           "--fabric-seconds", str(seconds), "--fabric-omit",
                                           "0", "--env", str(env), "--runs", str(runs)],
                                    tmp / f"deploy-{hosts}.json")
            row["deploy"] = {"before_gates": row["gates"].pop("before_gates"),
                             "wall_s": round(sum(f["wall_s"] for f in row["gates"].values()),
                                             3)}
        else:
            steps = {"discover": (), "install": ("--checkout", str(checkout)), "engines": (),
                     "fabric": ("--seconds", str(seconds), "--omit", "0"), "attest": (),
                     "preflight": (), "serve": ()}
            for name in GATE_NAMES:
                if name == "install":  # prepared where a package index answers, as an
                    row["install_prepare"] = gate(  # operator does
                        "install_prepare", "install", "--prepare-only", "--checkout",
                        str(checkout), in_lab=False)
                row["gates"][name] = gate(name, name, *steps[name])
        _add_record_figures(row, runs / "scale", seconds)
        row["memory_per_host_mib"] = round((mem0 - _available_bytes()) / hosts / 2**20, 1)
        passed = True
        return row
    finally:
        if passed or os.environ.get("NARWHAL_SCALE_HOLD") != "1":
            lifecycle.down(NAME)
        else:  # NARWHAL_SCALE_HOLD=1: a failed size's lab is kept up to look at
            print(f"bench: the lab {NAME} is left up (`narwhal lab down {NAME}`)", flush=True)


def _wheelhouse(checkout: Path) -> Path:
    """The revision's runtime wheels, downloaded here in the root namespace (where a package
    index answers, as on an operator's workstation) once per lock."""
    lock_path = checkout / "runtime.lock"
    digest = hashlib.sha256(lock_path.read_bytes()).hexdigest()[:16]
    wheels = Path(__file__).resolve().parents[1] / ".cache" / f"wheelhouse-{digest}"
    wheelhouse.build(wheels, lock_path, load_lock(lock_path))
    return wheels


def prebuilt(shared_runs: Path, checkout: Path, revision: str) -> Path:
    """The revision's bundle and Narwhal wheels built once for every size (`deploy` would
    otherwise compile the router's wheel again in each size's Gate B); the runtime wheels."""
    lock_bytes, lock = prepared.revision_lock(checkout, revision)
    wheels = _wheelhouse(checkout)
    prepared.build_inputs(shared_runs, checkout, revision, lock_bytes, lock, wheels,
                          lambda *_: None)
    return wheels


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("bench: no MemAvailable in /proc/meminfo")


def _add_record_figures(row: dict[str, Any], record: Path, seconds: int) -> None:
    """Each gate's critical path, and Gate D's overhead per edge, from the ledger's record."""
    ledger = json.loads((record / "ledger.json").read_text())
    for name in GATE_NAMES:
        attempt = record / name / ledger["gates"][name]["last"]
        commands = attempt / "commands.jsonl"
        lines = commands.read_text().splitlines() if commands.exists() else []
        rows = [json.loads(line) for line in lines]
        count, chain_s = critical_path(rows)
        row["gates"][name].update(critical_path_commands=count,
                                  critical_path_s=round(chain_s, 3), remote_commands=len(rows))
        if name == "fabric":
            row["gates"][name].update(edge_overhead_s(rows, seconds))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="4,8,16,32", help="lab sizes, router host included")
    p.add_argument("--seconds", type=int, default=1, help="Gate D's sample per edge")
    p.add_argument("--add-to", type=Path, metavar="RESULTS.json",
                   help="an earlier run's results (same --seconds): its sizes join this run's "
                        "in the fits and the plot, so the longest size can run on its own")
    p.add_argument("--deploy", action="store_true",
                   help="run the gates as one `narwhal deploy` (--fabric-seconds S "
                        "--fabric-omit 0), each gate's figures read where its progress starts")
    p.add_argument("--work", type=Path, metavar="DIR",
                   help="work in this (new) folder instead of a temporary one: the checkout, "
                        "each size's records and documents and rows.json after each size")
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="copy each size's deployment record here (runs-<hosts>) to read later")
    args = p.parse_args()
    sizes = [int(x) for x in args.hosts.split(",")]
    rows: list[dict[str, Any]] = []
    if args.add_to is not None:
        earlier = json.loads(args.add_to.read_text())
        if earlier["summary"]["seconds_per_sample"] != args.seconds:
            raise SystemExit(f"bench: {args.add_to} sampled edges for another --seconds")
        rows = [r for r in earlier["runs"] if r["hosts"] not in sizes]
    with tempfile.TemporaryDirectory(prefix="narwhal-scale-") as scratch:
        tmp = args.work or Path(scratch)  # --work: records, documents and rows outlive a failure
        checkout, revision = clean_checkout(tmp / "checkout")
        wheels = prebuilt(tmp / "shared-runs", checkout, revision) if args.deploy else None
        for hosts in sizes:
            try:
                rows.append(one_size(hosts, args.seconds, checkout, revision, tmp, wheels))
            finally:
                if args.keep is not None and (tmp / f"runs-{hosts}").exists():
                    shutil.copytree(tmp / f"runs-{hosts}", args.keep / f"runs-{hosts}",
                                    dirs_exist_ok=True, symlinks=True)
            (tmp / "rows.json").write_text(json.dumps(rows, indent=1))
    rows.sort(key=lambda r: int(r["hosts"]))
    summary = {"hosts": [r["hosts"] for r in rows], "seconds_per_sample": args.seconds,
               "fits": fits(rows)}
    out = write_results("scale", summary, rows)
    plot(rows, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
