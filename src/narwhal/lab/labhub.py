"""The lab's hub: its store built at `lab up`, its server run in the namespace `<lab>-hub`
(management address .5) and stopped by PID, and where the `.env` finds it (`hub_access`).

The model repo gets two commits on main, the same in every lab: the checkpoint files that
hostfs would otherwise write on each engine host plus pseudo-random weights from a fixed seed,
then a README.md model card. Commit ids depend only on content, parent and message, so a test
may name them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from narwhal.core.private_file import write_private
from narwhal.lab import boot
from narwhal.lab.hostfs import write_model_files
from narwhal.lab.hub.store import Store
from narwhal.lab.plan import LabPlan
from narwhal.lab.run import LabError, in_netns
from narwhal.lab.state import Proc, alive, start_ticks

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_BYTES = 4 * 1024 * 1024
WEIGHTS_SEED = b"narwhal-lab weights v1"  # every lab's weights are these same bytes
BASE_MODEL = "narwhal-lab/tiny-llama-base"
READY_TIMEOUT_S = 10.0
FILES_MESSAGE = "Upload checkpoint files and weights"
CARD_MESSAGE = "Add model card"


@dataclass(frozen=True)
class HubAccess:
    """What a client on a lab host needs to stage the lab model from the hub."""

    endpoint: str  # HF_ENDPOINT, as the hosts reach the hub
    repo_id: str
    token_path: Path | None  # a 0600 file holding the granted token (gated repos only)


def token_file(plan: LabPlan) -> Path:
    return plan.dir / "secrets" / "hub.token"


def store_dir(plan: LabPlan) -> Path:
    return plan.hub_dir / "store"


def endpoint(plan: LabPlan) -> str:
    assert plan.spec.hub is not None
    return f"http://{plan.hub_ip}:{plan.spec.hub.port}"


def hub_access(plan: LabPlan) -> HubAccess | None:
    """The hub's endpoint, the lab model's repo id and the token file; None without a hub."""
    if plan.spec.hub is None:
        return None
    return HubAccess(endpoint(plan), plan.spec.model.name,
                     token_file(plan) if plan.spec.hub.gated else None)


def weights() -> bytes:
    """The lab checkpoint's weights: not a valid safetensors file (nothing in the lab loads
    it), only bytes that are the same in every lab and large enough to be a real transfer."""
    return hashlib.shake_256(WEIGHTS_SEED).digest(WEIGHTS_BYTES)


def card_text(model_name: str) -> str:
    return "\n".join([
        "---", "license: apache-2.0", f"base_model: {BASE_MODEL}", "pipeline_tag: text-generation",
        "library_name: transformers", "tags:", "- narwhal-lab", "---", "",
        f"# {model_name}", "",
        "A tiny Llama-shaped checkpoint for Narwhal's rehearsal lab; its weights are "
        "pseudo-random bytes.", ""])


def _grant_token(plan: LabPlan) -> str:
    """A fresh token for the gated repo, kept only in a 0600 file (the store holds its hash)."""
    token = "hf_" + secrets.token_hex(17)
    token_file(plan).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(token_file(plan), token + "\n")
    return token


def build_store(plan: LabPlan) -> tuple[str, str]:
    """Create the store with the lab model's repo; return its two commit ids."""
    spec = plan.spec
    assert spec.hub is not None
    plan.hub_dir.mkdir(parents=True, exist_ok=True)
    store = Store(store_dir(plan))
    tokens = (_grant_token(plan),) if spec.hub.gated else ()
    store.init_repo(spec.model.name, gated="manual" if spec.hub.gated else False, tokens=tokens)
    with tempfile.TemporaryDirectory(dir=plan.hub_dir, prefix="staging-") as staging:
        folder = Path(staging) / "model"
        write_model_files(spec, folder)
        if not (folder / WEIGHTS_NAME).exists():
            (folder / WEIGHTS_NAME).write_bytes(weights())
        first = store.push(spec.model.name, folder, message=FILES_MESSAGE).id
        (folder / "README.md").write_text(card_text(spec.model.name))
        second = store.push(spec.model.name, folder, message=CARD_MESSAGE).id
    return first, second


def _ready_file(plan: LabPlan) -> Path:
    return plan.hub_dir / "ready.json"


def start(plan: LabPlan) -> Proc:
    """Start the hub server in its namespace; return its recorded process (`ip netns exec`
    execs the server, so the PID is the server's own)."""
    assert plan.spec.hub is not None
    _ready_file(plan).unlink(missing_ok=True)
    argv = in_netns(plan.hub_netns, [
        sys.executable, "-m", "narwhal.lab.hub", "serve", "--store", str(store_dir(plan)),
        "--listen", f"{plan.hub_ip}:{plan.spec.hub.port}", "--ready-file", str(_ready_file(plan))])
    with open(plan.hub_dir / "hub.log", "ab") as log:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True, close_fds=True)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        ticks = start_ticks(child.pid)
        if ticks is not None:
            return Proc(pid=child.pid, start_ticks=ticks, what="lab hub")
        time.sleep(0.005)
    raise LabError(f"the lab hub did not start: {_log_tail(plan)}")


def wait_ready(plan: LabPlan, proc: Proc, deadline: float) -> None:
    """Wait until the hub's origins listen (it writes its ready file after binding both)."""
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(_ready_file(plan).read_text()).get("endpoint") == endpoint(plan):
                return
        if not alive(proc):
            break
        time.sleep(0.01)
    raise LabError(f"the lab hub is not listening on {endpoint(plan)}: {_log_tail(plan)}")


def _log_tail(plan: LabPlan) -> str:
    with contextlib.suppress(OSError):
        return (plan.hub_dir / "hub.log").read_text()[-600:]
    return "(no log)"


def stop(proc: Proc) -> bool:
    return boot.stop(proc)


def push(plan: LabPlan, folder: Path, *, repo_id: str | None = None, branch: str = "main",
         message: str = "Upload folder") -> str:
    """Commit folder as the branch's next commit in the running lab's hub; return its id."""
    if plan.spec.hub is None:
        raise LabError(f"lab {plan.spec.name} has no hub; add a hub section to its spec")
    return Store(store_dir(plan)).push(repo_id or plan.spec.model.name, folder, branch=branch,
                                       message=message).id
