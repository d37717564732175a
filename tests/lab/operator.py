"""The operator's side of a lab test: a workstation .env and runs folder, and `narwhal`
commands run in the workstation namespace exactly as an operator types them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.lab.plan import LabPlan

NARWHAL = str(Path(sys.executable).parent / "narwhal")


def lab_unavailable() -> str | None:
    """Why a lab cannot be built on this machine (None: it can): root and `ip netns`."""
    if os.geteuid() != 0:
        return "lab tests need root (network namespaces, mounts)"
    if shutil.which("ip") is None or subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                     check=False).returncode != 0:
        return "`ip netns` is unavailable on this machine"
    return None


@dataclass
class Operator:
    """The workstation's view: a .env and a runs folder, commands run in its namespace."""

    plan: LabPlan
    env: Path
    runs: Path

    def narwhal(self, *args: str, env: Path | None = None) -> subprocess.CompletedProcess[str]:
        argv = [NARWHAL, "lab", "exec", "--", NARWHAL, *args, "--env", str(env or self.env),
                "--runs", str(self.runs)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)

    def shell(self, role: str, *command: str) -> subprocess.CompletedProcess[str]:
        """`narwhal shell --role ROLE -- COMMAND`: one command in a role's shell on its host."""
        argv = [NARWHAL, "lab", "exec", "--", NARWHAL, "shell", "--role", role, "--env",
                str(self.env), "--runs", str(self.runs), "--", *command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)

    def discover(self, env: Path | None = None) -> tuple[int, dict[str, Any]]:
        return self.json_command("discover", env=env)

    def json_command(self, *args: str, env: Path | None = None) -> tuple[int, dict[str, Any]]:
        """Run `narwhal ARGS --json`; its exit status and the one JSON document it printed."""
        done = self.narwhal(*args, "--json", env=env)
        try:
            doc = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise AssertionError(done.stdout[-2000:] + done.stderr[-3000:]) from None
        return done.returncode, doc

    def variant(self, name: str, **values: str) -> Path:
        """A copy of the .env with variables set (an operator's edit)."""
        lines = [ln for ln in self.env.read_text().splitlines()
                 if ln.split("=", 1)[0] not in values]
        path = self.env.with_name(f"{name}.env")
        path.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in values.items())]) + "\n")
        path.chmod(0o600)
        return path

    def last_attempt(self, gate: str = "discover") -> Path:
        doc = json.loads((self.runs / "lab" / "ledger.json").read_text())
        return self.runs / "lab" / gate / doc["gates"][gate]["last"]


