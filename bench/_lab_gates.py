"""What the gate benches share: a clean checkout of HEAD, `narwhal` in or out of the lab's
workstation namespace, and a fresh lab's `.env` for one run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from narwhal.lab import envfile
from narwhal.lab.plan import LabPlan

REPO = Path(__file__).resolve().parents[1]
NARWHAL = str(Path(sys.executable).parent / "narwhal")


def clean_checkout(where: Path) -> tuple[Path, str]:
    """A clone of this checkout's HEAD (the revision the bench approves) and its commit id."""
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    revision = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    return where, revision


def narwhal(env: Path, runs: Path, *args: str, lab: bool = True) -> subprocess.CompletedProcess[str]:
    """`narwhal ARGS --env --runs`, from the workstation namespace unless lab=False."""
    prefix = [NARWHAL, "lab", "exec", "--"] if lab else []
    return subprocess.run([*prefix, NARWHAL, *args, "--env", str(env), "--runs", str(runs)],
                          capture_output=True, text=True, check=False)


def lab_env(plan: LabPlan, path: Path, deployment: str, revision: str) -> Path:
    """The lab's `.env` with a deployment name and the approved revision."""
    envfile.write(plan, path)
    with path.open("a") as fh:
        fh.write(f"NARWHAL_DEPLOYMENT={deployment}\nNARWHAL_DEPLOYMENT_REVISION={revision}\n")
    return path


def pass_gates(env: Path, runs: Path, checkout: Path, *, engines: bool) -> None:
    """Gates A and B (prepared in the root namespace, where a package index answers), and C
    when `engines`: what a gate bench needs behind it before it times its own gate."""
    steps: list[tuple[list[str], bool]] = [
        (["hosts", "trust", "--yes"], True), (["discover"], True),
        (["install", "--prepare-only", "--checkout", str(checkout)], False),
        (["install", "--checkout", str(checkout)], True),
        *([(["engines"], True)] if engines else [])]
    for step, in_lab in steps:
        done = narwhal(env, runs, *step, lab=in_lab)
        if done.returncode != 0:
            raise SystemExit(f"bench: {step[0]} failed: {done.stderr[-2000:]}")


def last_attempt(runs: Path, deployment: str, gate: str) -> Path:
    """The folder of a gate's newest attempt in a bench's record."""
    ledger = json.loads((runs / deployment / "ledger.json").read_text())
    return runs / deployment / gate / ledger["gates"][gate]["last"]


def write_results(name: str, summary: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    """The summary and per-run rows to bench/results/<name>-<local time>.json."""
    print(json.dumps(summary))
    out = REPO / "bench" / "results" / f"{name}-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps({"summary": summary, "runs": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return out
