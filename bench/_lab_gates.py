"""What the gate benches share: a clean checkout of HEAD, `narwhal` in or out of the lab's
workstation namespace, and a fresh lab's `.env` for one run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
