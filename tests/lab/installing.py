"""The installer's side of a lab test: a lab with Gates A and B behind it, shared by a session.

The checkout is a clean clone of this repository's HEAD (the approved revision is what was
committed); the wheelhouse is built here in the root namespace, where a package index
answers, as on an operator's workstation. One installer serves every lab module, so the
revision's wheels (the router's compiled request path) are built once per session.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.lab.operator import NARWHAL, Operator

from narwhal.deploy.package import wheelhouse
from narwhal.deploy.package.lock import load_lock
from narwhal.lab import envfile
from narwhal.lab.plan import LabPlan

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Installer:
    op: Operator
    checkout: Path
    wheels: Path
    revision: str
    token: str
    router_key: str  # NARWHAL_ROUTER_API_KEY: the router serves no client without it
    engine_key: str  # NARWHAL_ENGINE_KEY: every engine's /v1 routes need it

    def secrets_dir(self) -> str:
        """The prepared run's secrets folder on every host (the same path on each)."""
        plan = json.loads((self.op.last_attempt("install") / "plan.json").read_text())
        return f"{self.remote}/runs/{plan['prepared_run']}/secrets"

    def install(self, *extra: str, env: Path | None = None,
                wheels: Path | None = None) -> subprocess.CompletedProcess[str]:
        return self.op.narwhal("install", "--json", "--checkout", str(self.checkout),
                               "--wheelhouse", str(wheels or self.wheels), *extra, env=env)

    def cut_install(self, caught: Callable[[], bool], cut: Callable[[], None]) -> dict[str, Any]:
        """Run `narwhal install` in the background, `cut` it once `caught()` says it is at the
        moment wanted, and return its (blocked) verdict."""
        argv = [NARWHAL, "lab", "exec", "--", NARWHAL, "install", "--json", "--checkout",
                str(self.checkout), "--wheelhouse", str(self.wheels), "--env", str(self.op.env),
                "--runs", str(self.op.runs)]
        running = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        try:
            deadline = time.monotonic() + 120
            while not caught():
                assert running.poll() is None and time.monotonic() < deadline, \
                    "the install ended before the moment to cut it came"
                time.sleep(0.05)
            cut()
            out, _ = running.communicate(timeout=300)
        finally:
            if running.poll() is None:
                running.kill()
        assert running.returncode != 0
        verdict: dict[str, Any] = json.loads(out)
        return verdict

    def doc(self, done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        try:
            return dict(json.loads(done.stdout))
        except json.JSONDecodeError:
            raise AssertionError(done.stdout[-2000:] + done.stderr[-3000:]) from None

    @property
    def remote(self) -> str:
        return f"/root/Narwhal-deploy/lab-{self.revision[:12]}"

    def lab_host(self, alias: str) -> str:
        plan = self.op.plan
        if alias == "router":
            return str(next(h.name for h in plan.hosts if h.host.role == "router"))
        return str(plan.engines()[int(alias.split("-")[1]) - 1].name)

    def attempts(self) -> list[str]:
        doc = json.loads((self.op.runs / "lab" / "ledger.json").read_text())
        return list(doc["gates"].get("install", {}).get("attempts", []))


def approved_checkout(work: Path) -> tuple[Path, str, Path]:
    """(checkout, revision, wheelhouse): a clean clone of this repository's HEAD (the
    approved revision is what was committed) and its runtime.lock's wheels, built here in the
    root namespace, where a package index answers, once per lock."""
    checkout = work / "checkout"
    subprocess.run(["git", "clone", "-q", str(REPO), str(checkout)], check=True)
    revision = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    lock_path = checkout / "runtime.lock"
    wheels = REPO / ".cache" / f"wheelhouse-{hashlib.sha256(lock_path.read_bytes()).hexdigest()[:16]}"
    wheelhouse.build(wheels, lock_path, load_lock(lock_path))
    return checkout, revision, wheels


@pytest.fixture(scope="session")
def installer(lab: LabPlan, tmp_path_factory: pytest.TempPathFactory) -> Installer:
    work = tmp_path_factory.mktemp("install")
    checkout, revision, wheels = approved_checkout(work)
    token = "hf_" + secrets.token_hex(16)
    router_key, engine_key = secrets.token_hex(24), secrets.token_hex(24)
    env = work / ".env"
    envfile.write(lab, env)
    with env.open("a") as fh:  # the lab deploys with both keys, as a fleet should
        fh.write(f"NARWHAL_DEPLOYMENT=lab\nNARWHAL_DEPLOYMENT_REVISION={revision}\n"
                 f"NARWHAL_HF_TOKEN={token}\nNARWHAL_ROUTER_API_KEY={router_key}\n"
                 f"NARWHAL_ENGINE_KEY={engine_key}\n")
    op = Operator(lab, env, work / "runs")
    assert op.narwhal("hosts", "trust", "--yes").returncode == 0
    code, doc = op.discover()
    assert code == 0, doc
    return Installer(op, checkout, wheels, revision, token, router_key, engine_key)




def rows(attempt: Path) -> list[dict[str, Any]]:
    """The attempt's commands.jsonl rows (none when it ran no command)."""
    path = attempt / "commands.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
